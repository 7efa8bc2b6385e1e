/*
 * Writes LEN bytes of a pattern to HOST:PORT, closes the socket and
 * returns from main at once: what was still unsent or unacknowledged must
 * reach the server all the same, as on Linux, whose kernel carries the
 * connection on after the process (under `ginza run`, `exit` lingers for
 * it: docs/preload.md, "Exit").
 *
 *     send_close_exit HOST PORT LEN
 */
#include "net.h"

int main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: %s HOST PORT LEN", argv[0]);
	size_t len = (size_t)atol(argv[3]);
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port_arg(argc, argv, 2)) };
	CHECK(inet_pton(AF_INET, argv[1], &to.sin_addr) == 1, "bad address %s", argv[1]);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	CHECK(connect(s, (struct sockaddr *)&to, sizeof to) == 0, "connect: %s", strerror(errno));
	char *buf = malloc(len);
	CHECK(buf != NULL, "malloc");
	for (size_t i = 0; i < len; i++)
		buf[i] = (char)(i % 251);
	CHECK(write_all(s, buf, len) == 0, "write: %s", strerror(errno));
	CHECK(close(s) == 0, "close: %s", strerror(errno));
	printf("ok send_close_exit\n");
	return 0;
}

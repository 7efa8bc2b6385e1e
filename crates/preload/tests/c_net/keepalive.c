/*
 * Keep-alive through the socket options: SO_KEEPALIVE with TCP_KEEPIDLE,
 * TCP_KEEPINTVL and TCP_KEEPCNT on a connection to HOST:PORT, then a read
 * that waits while the peer vanishes (the harness takes its link down):
 * the unanswered probes end it with ETIMEDOUT.
 *
 *     keepalive HOST PORT
 */
#include "net.h"

int main(int argc, char **argv)
{
	CHECK(argc == 3, "usage: %s HOST PORT", argv[0]);
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
	CHECK(inet_pton(AF_INET, argv[1], &to.sin_addr) == 1, "bad HOST %s", argv[1]);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	CHECK(connect(s, (struct sockaddr *)&to, sizeof to) == 0, "connect: %s", strerror(errno));
	int one = 1, idle = 1, interval = 1, count = 2;
	CHECK(setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) == 0, "SO_KEEPALIVE");
	CHECK(setsockopt(s, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) == 0, "TCP_KEEPIDLE");
	CHECK(setsockopt(s, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) == 0,
	      "TCP_KEEPINTVL");
	CHECK(setsockopt(s, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) == 0, "TCP_KEEPCNT");
	say_ready();
	char buf[16];
	uint64_t t0 = now_ns();
	ssize_t r = read(s, buf, sizeof buf);
	CHECK(r == -1 && errno == ETIMEDOUT, "read after the peer vanished: %zd %s", r,
	      strerror(errno));
	printf("timed out after %.1f s\n", (double)(now_ns() - t0) / 1e9);
	PASS("keepalive");
}

/*
 * bind, then connect: the connection keeps the bound local port, as on
 * Linux. A blocking socket bound to LOCAL_PORT, and a non-blocking one
 * bound to port 0 (a port chosen at bind), each connect to HOST:PORT;
 * getsockname names the bound port before and after connecting, and the
 * server, told that port, answers with the port it saw.
 *
 *     bound_connect HOST PORT LOCAL_PORT
 */
#include "net.h"

#include <poll.h>

static int port_of(int s)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	CHECK(getsockname(s, (struct sockaddr *)&a, &len) == 0, "getsockname: %s",
	      strerror(errno));
	return ntohs(a.sin_port);
}

static int bound(int flags, int port)
{
	int s = socket(AF_INET, SOCK_STREAM | flags, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0, "bind to port %d: %s", port,
	      strerror(errno));
	return s;
}

/* Tells the server the port we see and checks it saw the same. */
static void agree(int s, int port)
{
	char msg[32], want[32], got[32] = { 0 };
	int len = snprintf(msg, sizeof msg, "port %d\n", port);
	CHECK(write_all(s, msg, (size_t)len) == 0, "write: %s", strerror(errno));
	int wlen = snprintf(want, sizeof want, "seen %d\n", port);
	size_t at = 0;
	while (at < (size_t)wlen) {
		ssize_t r = read(s, got + at, (size_t)wlen - at);
		CHECK(r > 0, "reading the server's answer: %zd %s", r, strerror(errno));
		at += (size_t)r;
	}
	CHECK(!memcmp(got, want, (size_t)wlen), "the server saw \"%s\", we are on port %d", got,
	      port);
}

int main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: bound_connect HOST PORT LOCAL_PORT");
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port_arg(argc, argv, 2)) };
	CHECK(inet_pton(AF_INET, argv[1], &to.sin_addr) == 1, "bad HOST %s", argv[1]);
	int local = port_arg(argc, argv, 3);

	int s = bound(0, local);
	CHECK(port_of(s) == local, "bound to %d, getsockname says %d", local, port_of(s));
	CHECK(connect(s, (struct sockaddr *)&to, sizeof to) == 0, "connect: %s", strerror(errno));
	CHECK(port_of(s) == local, "connected from %d, bound to %d", port_of(s), local);
	agree(s, local);

	int n = bound(SOCK_NONBLOCK, 0);
	int chosen = port_of(n);
	CHECK(chosen != 0, "bind to port 0 chose no port");
	int r = connect(n, (struct sockaddr *)&to, sizeof to);
	CHECK(r == 0 || errno == EINPROGRESS, "non-blocking connect: %s", strerror(errno));
	struct pollfd p = { .fd = n, .events = POLLOUT };
	CHECK(poll(&p, 1, 10000) == 1, "the connect did not finish within 10 s");
	int err = -1;
	socklen_t elen = sizeof err;
	CHECK(getsockopt(n, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0,
	      "SO_ERROR: %s", strerror(err));
	CHECK(port_of(n) == chosen, "connected from %d, bound to %d", port_of(n), chosen);
	int fl = fcntl(n, F_GETFL);
	CHECK(fcntl(n, F_SETFL, fl & ~O_NONBLOCK) == 0, "clearing O_NONBLOCK: %s", strerror(errno));
	agree(n, chosen);

	close(s);
	close(n);
	printf("ok bound_connect\n");
	return 0;
}

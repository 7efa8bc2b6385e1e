/*
 * What the socket test programs share (on top of ../c/check.h): a
 * listening socket on 0.0.0.0, whole reads and writes, and the "ready"
 * line the Rust harness (../sockets.rs) waits for before it connects.
 */
#ifndef GINZA_TEST_NET_H
#define GINZA_TEST_NET_H

#include "../c/check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

/* A TCP socket listening on 0.0.0.0:port (the program's Ginza address
 * under `ginza run`), SO_REUSEADDR set, O_NONBLOCK if asked. */
static inline int listen_on(int port, int nonblocking)
{
	int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
	CHECK(fd >= 0, "socket: %s", strerror(errno));
	int one = 1;
	CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0,
	      "SO_REUSEADDR: %s", strerror(errno));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_ANY) };
	CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind :%d: %s", port,
	      strerror(errno));
	CHECK(listen(fd, 4096) == 0, "listen: %s", strerror(errno));
	return fd;
}

/* Tells the harness the server listens. */
static inline void say_ready(void)
{
	printf("ready\n");
	fflush(stdout);
}

/* Writes all of buf (blocking descriptor); 0, or -1 with errno. */
static inline int write_all(int fd, const char *buf, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, buf, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		buf += w;
		n -= (size_t)w;
	}
	return 0;
}

static inline int port_arg(int argc, char **argv, int i)
{
	CHECK(argc > i, "usage: %s PORT ...", argv[0]);
	return atoi(argv[i]);
}

#endif

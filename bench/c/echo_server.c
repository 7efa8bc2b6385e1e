/*
 * The C half of `ginza bench memcached`'s library cost: a TCP echo server
 * reading what arrives and writing it back until the client closes.
 *
 *     echo_server PORT            one blocking thread per connection
 *     echo_server PORT epoll      one thread, level-triggered epoll over
 *                                 the listener and every connection
 *                                 (memcached's pattern)
 *
 * The native peer is ginza_apps' echo_server::serve_tcp on
 * ginza_runtime::net::TcpStream: the blocking mode's logic, a uthread per
 * connection. Run under `ginza run`, the difference between the two is the
 * preload library's (and, in epoll mode, its readiness multiplexer's).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "echo_server: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void *serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char buf[16384];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(fd, buf + off, (size_t)(n - off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				goto done;
			off += w;
		}
	}
done:
	close(fd);
	return NULL;
}

/* Echoes what one readable connection has; false when it is done. */
static int echo_once(int fd)
{
	char buf[16384];
	ssize_t n;
	do
		n = read(fd, buf, sizeof buf);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return 0;
	for (ssize_t off = 0; off < n;) {
		ssize_t w = write(fd, buf + off, (size_t)(n - off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return 0;
		off += w;
	}
	return 1;
}

static void serve_epoll(int l)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = l };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) != 0)
		die("epoll_ctl ADD listener");
	int one = 1;
	for (;;) {
		struct epoll_event ready[64];
		int n = epoll_wait(ep, ready, 64, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		for (int i = 0; i < n; i++) {
			int fd = ready[i].data.fd;
			if (fd == l) {
				int c = accept(l, NULL, NULL);
				if (c < 0)
					continue;
				setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
				struct epoll_event cev = { .events = EPOLLIN, .data.fd = c };
				if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) != 0)
					die("epoll_ctl ADD connection");
			} else if (!echo_once(fd)) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
			}
		}
	}
}

int main(int argc, char **argv)
{
	char *end;
	long port = argc >= 2 ? strtol(argv[1], &end, 10) : -1;
	int epoll = argc == 3 && strcmp(argv[2], "epoll") == 0;
	if (argc < 2 || argc > 3 || (argc == 3 && !epoll) || *end != '\0' || port <= 0 ||
	    port > 65535) {
		fprintf(stderr, "usage: echo_server PORT [epoll]  (PORT 1-65535)\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0)
		die("socket");
	int one = 1;
	if (setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
		die("SO_REUSEADDR");
	struct sockaddr_in a = {
		.sin_family = AF_INET,
		.sin_port = htons((uint16_t)port),
		.sin_addr.s_addr = htonl(INADDR_ANY),
	};
	if (bind(l, (struct sockaddr *)&a, sizeof a) != 0)
		die("bind");
	if (listen(l, 128) != 0)
		die("listen");
	if (epoll) {
		serve_epoll(l);
		return 0;
	}
	pthread_attr_t attr;
	if (pthread_attr_init(&attr) != 0 ||
	    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) != 0 ||
	    pthread_attr_setstacksize(&attr, 64 << 10) != 0)
		die("pthread_attr");
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			die("accept");
		}
		/* As the native server: replies go out at once. */
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		pthread_t t;
		if (pthread_create(&t, &attr, serve, (void *)(intptr_t)c) != 0)
			die("pthread_create");
	}
}

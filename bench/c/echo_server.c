/*
 * The C half of `ginza bench memcached`'s library cost: a blocking TCP
 * echo server, one thread per connection, reading what arrives and writing
 * it back until the client closes. The native half is ginza_apps'
 * echo_server::serve_tcp on ginza_runtime::net::TcpStream: the same logic,
 * a uthread per connection. Run under `ginza run`, the difference between
 * the two is the preload library's.
 *
 *     echo_server PORT
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

int main(int argc, char **argv)
{
	char *end;
	long port = argc == 2 ? strtol(argv[1], &end, 10) : -1;
	if (argc != 2 || *end != '\0' || port <= 0 || port > 65535) {
		fprintf(stderr, "usage: echo_server PORT (1-65535)\n");
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

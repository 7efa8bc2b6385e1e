/*
 * A blocking echo server, a thread per connection: accept, then read and
 * write back until the client closes. Runs until killed.
 *
 *     echo_blocking PORT
 */
#include "net.h"

#include <pthread.h>

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
		if (write_all(fd, buf, (size_t)n) != 0)
			break;
	}
	close(fd);
	return NULL;
}

int main(int argc, char **argv)
{
	int port = port_arg(argc, argv, 1);
	signal(SIGPIPE, SIG_IGN);
	int l = listen_on(port, 0);
	say_ready();
	pthread_attr_t attr;
	PT(pthread_attr_init(&attr));
	PT(pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED));
	PT(pthread_attr_setstacksize(&attr, 64 << 10));
	for (;;) {
		struct sockaddr_in peer;
		socklen_t len = sizeof peer;
		int c = accept(l, (struct sockaddr *)&peer, &len);
		if (c < 0) {
			CHECK(errno == EINTR || errno == ECONNABORTED || errno == EMFILE,
			      "accept: %s", strerror(errno));
			continue;
		}
		CHECK(len == sizeof peer && peer.sin_family == AF_INET,
		      "accept gave a peer of %u bytes, family %d", len, peer.sin_family);
		pthread_t t;
		PT(pthread_create(&t, &attr, serve, (void *)(intptr_t)c));
	}
}

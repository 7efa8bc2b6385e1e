/*
 * A single-threaded epoll echo server on non-blocking sockets, level- or
 * edge-triggered. Bytes a client does not read are kept and sent when the
 * socket is writable again (EPOLLOUT), so a client that never reads holds
 * only its own buffer. At a client's end of stream what is still pending
 * is written with the socket made blocking again (fcntl), then it is
 * closed: a client that half-closes gets all its bytes back. Runs until
 * killed.
 *
 *     echo_epoll PORT lt|et
 */
#include "net.h"

#include <sys/epoll.h>

struct conn {
	int fd;
	char *pending; /* bytes read and not yet written back */
	size_t len;
};

static int edge;

static void set_events(int ep, struct conn *c)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | (c->len ? EPOLLOUT : 0) |
					    (edge ? EPOLLET : 0),
				  .data.ptr = c };
	CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) == 0, "EPOLL_CTL_MOD: %s", strerror(errno));
}

static void drop_conn(int ep, struct conn *c)
{
	CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL) == 0, "EPOLL_CTL_DEL: %s", strerror(errno));
	close(c->fd);
	free(c->pending);
	free(c);
}

/* Writes what is pending; -1 when the connection is gone. */
static int flush(struct conn *c)
{
	size_t at = 0;
	while (at < c->len) {
		ssize_t w = send(c->fd, c->pending + at, c->len - at, MSG_NOSIGNAL);
		if (w < 0 && errno == EAGAIN)
			break;
		if (w < 0)
			return -1;
		at += (size_t)w;
	}
	memmove(c->pending, c->pending + at, c->len - at);
	c->len -= at;
	return 0;
}

/* Reads what there is (all of it when edge-triggered) and echoes it; 1 at
 * the end of the stream, -1 when the connection failed. */
static int on_readable(struct conn *c)
{
	char buf[16384];
	for (;;) {
		ssize_t n = read(c->fd, buf, sizeof buf);
		if (n == 0)
			return 1;
		if (n < 0)
			return errno == EAGAIN ? 0 : -1;
		c->pending = realloc(c->pending, c->len + (size_t)n);
		CHECK(c->pending, "out of memory");
		memcpy(c->pending + c->len, buf, (size_t)n);
		c->len += (size_t)n;
		if (flush(c) != 0)
			return -1;
		if (!edge)
			return 0;
	}
}

int main(int argc, char **argv)
{
	int port = port_arg(argc, argv, 1);
	CHECK(argc > 2 && (!strcmp(argv[2], "lt") || !strcmp(argv[2], "et")), "usage: %s PORT lt|et",
	      argv[0]);
	edge = !strcmp(argv[2], "et");
	int l = listen_on(port, 1);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0, "epoll_create1: %s", strerror(errno));
	struct epoll_event lev = { .events = EPOLLIN, .data.ptr = NULL };
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, l, &lev) == 0, "adding the listener: %s", strerror(errno));
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, l, &lev) == -1 && errno == EEXIST,
	      "adding the listener twice gave %s", strerror(errno));
	say_ready();
	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		if (n < 0 && errno == EINTR)
			continue;
		CHECK(n > 0, "epoll_wait with no timeout returned %d: %s", n, strerror(errno));
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (!c) {
				for (;;) {
					int fd = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
					if (fd < 0) {
						CHECK(errno == EAGAIN || errno == ECONNABORTED,
						      "accept4: %s", strerror(errno));
						break;
					}
					CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK, "accept4 lost SOCK_NONBLOCK");
					CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC, "accept4 lost SOCK_CLOEXEC");
					c = calloc(1, sizeof *c);
					CHECK(c, "out of memory");
					c->fd = fd;
					struct epoll_event ev = {
						.events = EPOLLIN | EPOLLRDHUP | (edge ? EPOLLET : 0),
						.data.ptr = c
					};
					CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0,
					      "EPOLL_CTL_ADD: %s", strerror(errno));
				}
				continue;
			}
			int gone = 0;
			if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
				gone = on_readable(c);
			if (!gone && (evs[i].events & EPOLLOUT))
				gone = flush(c);
			if (gone == 1 && c->len) {
				int fl = fcntl(c->fd, F_GETFL);
				CHECK(fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK) == 0, "F_SETFL: %s",
				      strerror(errno));
				flush(c);
			}
			if (gone)
				drop_conn(ep, c);
			else
				set_events(ep, c);
		}
	}
}

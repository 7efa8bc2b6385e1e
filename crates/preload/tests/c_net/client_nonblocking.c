/*
 * A non-blocking client: CONNS connections opened at once (EINPROGRESS,
 * then writable, SO_ERROR 0), a distinct message on each, the echoes
 * gathered with edge-triggered epoll and compared byte for byte; then a
 * refused connection, non-blocking (SO_ERROR ECONNREFUSED) and blocking.
 *
 *     client_nonblocking HOST PORT CLOSED_PORT CONNS
 */
#include "net.h"

#include <poll.h>
#include <sys/epoll.h>

#define MSG 1000

static struct sockaddr_in addr_of(const char *host, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1, "bad HOST %s", host);
	return a;
}

static void fill(char *buf, int conn)
{
	for (int i = 0; i < MSG; i++)
		buf[i] = (char)('a' + (conn * 7 + i) % 26);
}

int main(int argc, char **argv)
{
	CHECK(argc == 5, "usage: %s HOST PORT CLOSED_PORT CONNS", argv[0]);
	struct sockaddr_in to = addr_of(argv[1], atoi(argv[2]));
	struct sockaddr_in closed = addr_of(argv[1], atoi(argv[3]));
	int conns = atoi(argv[4]);
	CHECK(conns > 0 && conns <= 10000, "CONNS: 1 to 10000");
	int *fd = calloc((size_t)conns, sizeof *fd);
	struct pollfd *p = calloc((size_t)conns, sizeof *p);
	size_t *got = calloc((size_t)conns, sizeof *got);
	char (*echo)[MSG] = calloc((size_t)conns, MSG);
	CHECK(fd && p && got && echo, "out of memory");

	for (int i = 0; i < conns; i++) {
		fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		CHECK(fd[i] >= 0, "socket: %s", strerror(errno));
		int r = connect(fd[i], (struct sockaddr *)&to, sizeof to);
		CHECK(r == 0 || errno == EINPROGRESS, "connect %d: %s", i, strerror(errno));
		p[i] = (struct pollfd){ .fd = fd[i], .events = POLLOUT };
	}
	/* Every connection becomes writable, with no error. */
	for (int left = conns; left > 0;) {
		int n = poll(p, (nfds_t)conns, 10000);
		CHECK(n > 0, "poll for connections: %d (%s), %d still connecting", n, strerror(errno),
		      left);
		for (int i = 0; i < conns; i++) {
			if (p[i].fd < 0 || !p[i].revents)
				continue;
			CHECK(p[i].revents & POLLOUT, "connection %d: revents %#x", i, p[i].revents);
			int err = -1;
			socklen_t len = sizeof err;
			CHECK(getsockopt(fd[i], SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0,
			      "SO_ERROR of connection %d: %s", i, strerror(err));
			struct sockaddr_in peer;
			len = sizeof peer;
			CHECK(getpeername(fd[i], (struct sockaddr *)&peer, &len) == 0 &&
				      peer.sin_port == to.sin_port &&
				      peer.sin_addr.s_addr == to.sin_addr.s_addr,
			      "getpeername of connection %d", i);
			p[i].fd = -1;
			left--;
		}
	}
	int ep = epoll_create1(0);
	CHECK(ep >= 0, "epoll_create1: %s", strerror(errno));
	char msg[MSG];
	for (int i = 0; i < conns; i++) {
		fill(msg, i);
		CHECK(send(fd[i], msg, MSG, MSG_NOSIGNAL) == MSG, "send %d: %s", i, strerror(errno));
		struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.u32 = (uint32_t)i };
		CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd[i], &ev) == 0, "EPOLL_CTL_ADD: %s",
		      strerror(errno));
	}
	struct epoll_event evs[128];
	for (int done = 0; done < conns;) {
		int n = epoll_wait(ep, evs, 128, 10000);
		CHECK(n > 0, "epoll_wait for echoes: %d (%s), %d of %d done", n, strerror(errno), done,
		      conns);
		for (int k = 0; k < n; k++) {
			int i = (int)evs[k].data.u32;
			/* Edge-triggered: read until EAGAIN. */
			for (;;) {
				ssize_t r = recv(fd[i], echo[i] + got[i], MSG - got[i], 0);
				if (r < 0) {
					CHECK(errno == EAGAIN, "recv %d: %s", i, strerror(errno));
					break;
				}
				CHECK(r > 0, "connection %d closed after %zu bytes", i, got[i]);
				got[i] += (size_t)r;
				if (got[i] == MSG) {
					fill(msg, i);
					CHECK(!memcmp(msg, echo[i], MSG), "connection %d: wrong bytes", i);
					done++;
					break;
				}
			}
		}
	}
	for (int i = 0; i < conns; i++)
		CHECK(close(fd[i]) == 0, "close: %s", strerror(errno));

	/* Refused, non-blocking: writable with an error, SO_ERROR says why. */
	int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	int r = connect(s, (struct sockaddr *)&closed, sizeof closed);
	CHECK(r == -1 && errno == EINPROGRESS, "connect to a closed port: %d %s", r, strerror(errno));
	struct pollfd one = { .fd = s, .events = POLLOUT };
	CHECK(poll(&one, 1, 10000) == 1, "poll of a refused connection");
	CHECK(one.revents & (POLLERR | POLLHUP), "refused: revents %#x", one.revents);
	int err = 0;
	socklen_t len = sizeof err;
	CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == ECONNREFUSED,
	      "SO_ERROR: %s", strerror(err));
	close(s);
	/* Refused, blocking. */
	s = socket(AF_INET, SOCK_STREAM, 0);
	r = connect(s, (struct sockaddr *)&closed, sizeof closed);
	CHECK(r == -1 && errno == ECONNREFUSED, "blocking connect: %d %s", r, strerror(errno));
	close(s);
	PASS("client_nonblocking");
}

/*
 * memcached's pattern: the main thread accepts (blocking) and hands each
 * connection to a worker thread through the worker's pipe; each worker
 * waits in epoll on its pipe and its connections together (a kernel
 * descriptor and Ginza sockets in one set) and echoes, level-triggered.
 *
 *     echo_workers PORT WORKERS
 */
#include "net.h"

#include <pthread.h>
#include <sys/epoll.h>

struct worker {
	int pipe[2];
};

static void *work(void *arg)
{
	struct worker *w = arg;
	int ep = epoll_create1(0);
	CHECK(ep >= 0, "epoll_create1: %s", strerror(errno));
	struct epoll_event pev = { .events = EPOLLIN, .data.fd = w->pipe[0] };
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, w->pipe[0], &pev) == 0, "adding the pipe: %s",
	      strerror(errno));
	struct epoll_event evs[64];
	char buf[16384];
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		if (n < 0 && errno == EINTR)
			continue;
		CHECK(n > 0, "epoll_wait: %d %s", n, strerror(errno));
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			if (fd == w->pipe[0]) {
				int c;
				CHECK(read(fd, &c, sizeof c) == sizeof c, "reading the pipe: %s",
				      strerror(errno));
				int fl = fcntl(c, F_GETFL);
				CHECK(fl >= 0 && fcntl(c, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK: %s",
				      strerror(errno));
				struct epoll_event ev = { .events = EPOLLIN, .data.fd = c };
				CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0, "adding a connection: %s",
				      strerror(errno));
				continue;
			}
			ssize_t r = read(fd, buf, sizeof buf);
			if (r < 0 && errno == EAGAIN)
				continue;
			if (r > 0) {
				/* Small echoes: make the socket blocking for the write. */
				int fl = fcntl(fd, F_GETFL);
				fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
				int ok = write_all(fd, buf, (size_t)r) == 0;
				fcntl(fd, F_SETFL, fl);
				if (ok)
					continue;
			}
			CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL) == 0, "EPOLL_CTL_DEL: %s",
			      strerror(errno));
			close(fd);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int port = port_arg(argc, argv, 1);
	int workers = argc > 2 ? atoi(argv[2]) : 4;
	CHECK(workers > 0 && workers <= 64, "WORKERS: 1 to 64");
	signal(SIGPIPE, SIG_IGN);
	struct worker *w = calloc((size_t)workers, sizeof *w);
	CHECK(w, "out of memory");
	for (int i = 0; i < workers; i++) {
		CHECK(pipe(w[i].pipe) == 0, "pipe: %s", strerror(errno));
		pthread_t t;
		PT(pthread_create(&t, NULL, work, &w[i]));
	}
	int l = listen_on(port, 0);
	say_ready();
	for (unsigned next = 0;; next++) {
		int c = accept(l, NULL, NULL);
		if (c < 0) {
			CHECK(errno == EINTR || errno == ECONNABORTED, "accept: %s", strerror(errno));
			continue;
		}
		CHECK(write(w[next % workers].pipe[1], &c, sizeof c) == sizeof c, "handing over: %s",
		      strerror(errno));
	}
}

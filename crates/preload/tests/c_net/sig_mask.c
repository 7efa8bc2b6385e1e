/*
 * The signal mask of ppoll, pselect and epoll_pwait, over a Ginza socket
 * (a UDP socket on 0.0.0.0 that nothing is sent to). SIGUSR1 is blocked
 * in every thread and has a handler (no SA_RESTART). A thread sends it to
 * the process while the main thread waits:
 *
 *   - with a mask that lets SIGUSR1 in, each wait ends with EINTR, after
 *     the handler ran;
 *   - with a mask that blocks it, the wait is not interrupted: it times
 *     out, and the signal is taken once the program unblocks it.
 *
 * The sender sends 50 ms after the waiter says it is about to wait: under
 * `ginza run` a handler runs on a library thread that blocks nothing, so a
 * signal sent before the wait began would be taken before it (on Linux it
 * would stay pending until the wait's mask lets it in).
 *
 *     sig_mask PORT
 */
#include "net.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/select.h>

static atomic_int handled;
static atomic_int about_to_wait;

static void on_usr1(int sig)
{
	(void)sig;
	atomic_fetch_add(&handled, 1);
}

static void *sender(void *arg)
{
	(void)arg;
	while (!atomic_load(&about_to_wait))
		sched_yield();
	atomic_store(&about_to_wait, 0);
	usleep(50 * 1000);
	CHECK(kill(getpid(), SIGUSR1) == 0, "kill: %s", strerror(errno));
	return NULL;
}

enum call { PPOLL, PSELECT, EPOLL_PWAIT };
static const char *names[] = { "ppoll", "pselect", "epoll_pwait" };

/* One wait on `s` with `mask`, a signal sent during it; its result and
 * errno. */
static int wait_once(enum call c, int s, int ep, const sigset_t *mask, int timeout_ms,
		     int *err)
{
	pthread_t t;
	PT(pthread_create(&t, NULL, sender, NULL));
	atomic_store(&about_to_wait, 1);
	struct timespec ts = { .tv_sec = timeout_ms / 1000,
			       .tv_nsec = (long)(timeout_ms % 1000) * 1000000 };
	int r = -2;
	if (c == PPOLL) {
		struct pollfd p = { .fd = s, .events = POLLIN };
		r = ppoll(&p, 1, &ts, mask);
	} else if (c == PSELECT) {
		fd_set rd;
		FD_ZERO(&rd);
		FD_SET(s, &rd);
		r = pselect(s + 1, &rd, NULL, NULL, &ts, mask);
	} else {
		struct epoll_event ev;
		r = epoll_pwait(ep, &ev, 1, timeout_ms, mask);
	}
	*err = errno;
	PT(pthread_join(t, NULL));
	return r;
}

int main(int argc, char **argv)
{
	int port = port_arg(argc, argv, 1);
	struct sigaction sa = { .sa_handler = on_usr1 };
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction: %s", strerror(errno));
	sigset_t usr1, outside, lets_in, blocks;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	PT(pthread_sigmask(SIG_BLOCK, &usr1, &outside));
	lets_in = outside;
	sigdelset(&lets_in, SIGUSR1);
	blocks = outside;
	sigaddset(&blocks, SIGUSR1);

	int s = socket(AF_INET, SOCK_DGRAM, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0, "bind: %s", strerror(errno));
	int ep = epoll_create1(0);
	CHECK(ep >= 0, "epoll_create1: %s", strerror(errno));
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = s };
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0, "epoll_ctl: %s", strerror(errno));

	for (enum call c = PPOLL; c <= EPOLL_PWAIT; c++) {
		int before = atomic_load(&handled), err = 0;
		uint64_t t0 = now_ns();
		int r = wait_once(c, s, ep, &lets_in, 10000, &err);
		uint64_t ms = (now_ns() - t0) / 1000000;
		CHECK(r == -1 && err == EINTR, "%s with SIGUSR1 let in: %d (%s) after %llu ms",
		      names[c], r, strerror(err), (unsigned long long)ms);
		CHECK(atomic_load(&handled) == before + 1,
		      "%s ended with EINTR before the handler ran", names[c]);
		CHECK(ms < 5000, "%s took %llu ms to see the signal", names[c],
		      (unsigned long long)ms);

		before = atomic_load(&handled);
		r = wait_once(c, s, ep, &blocks, 300, &err);
		CHECK(r == 0, "%s with SIGUSR1 blocked: %d (%s), expected a timeout", names[c], r,
		      strerror(err));
		/* Linux keeps it pending until it is unblocked; under ginza run
		 * the library's signal thread may have taken it already. */
		PT(pthread_sigmask(SIG_UNBLOCK, &usr1, NULL));
		PT(pthread_sigmask(SIG_BLOCK, &usr1, NULL));
		uint64_t give_up = now_ns() + 5000000000ull;
		while (atomic_load(&handled) == before) {
			CHECK(now_ns() < give_up, "%s: the blocked signal was never taken",
			      names[c]);
			sched_yield();
		}
	}
	close(ep);
	close(s);
	printf("ok sig_mask\n");
	return 0;
}

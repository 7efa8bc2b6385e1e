/*
 * Signals and threads, as far as `ginza run` serves them (docs/preload.md):
 * a signal sent to the process runs the handler once, while 4 threads
 * sleep or spin; pthread_kill(t, SIGUSR1) runs the handler once (under
 * Ginza in whichever thread the process's signal lands on: uthreads have
 * no kernel thread of their own); pthread_kill(t, 0) reports t alive; and
 * raise() from a thread runs the handler in that thread before returning.
 */
#include "check.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#define THREADS 4

static pthread_t tids[THREADS];
static atomic_int hits;
static atomic_int stop;
static __thread volatile int raised_here;

static void on_usr1(int sig)
{
	(void)sig;
	int saved = errno;
	atomic_fetch_add(&hits, 1);
	raised_here++;
	errno = saved;
}

static void *body(void *arg)
{
	int id = (int)(uintptr_t)arg;
	while (!atomic_load(&stop)) {
		if (id % 2)
			usleep(500);
		else
			spin_ns(200 * 1000);
	}
	return NULL;
}

static void *raiser(void *arg)
{
	(void)arg;
	int before = raised_here;
	CHECK(raise(SIGUSR1) == 0, "raise: %s", strerror(errno));
	/* raise() returns after the handler ran in this thread. */
	CHECK(raised_here == before + 1,
	      "raise(): the handler did not run in the raising thread");
	return NULL;
}

static void wait_hits(int want, const char *what)
{
	uint64_t end = now_ns() + 5ull * 1000000000ull;
	while (atomic_load(&hits) < want && now_ns() < end)
		usleep(100);
	usleep(5 * 1000);
	CHECK(atomic_load(&hits) == want, "%s: the handler ran %d times, want %d",
	      what, atomic_load(&hits), want);
}

int main(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");

	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&tids[i], NULL, body, (void *)(uintptr_t)i));
	usleep(10 * 1000);
	int want = 0;
	for (int round = 1; round <= 5; round++) {
		CHECK(kill(getpid(), SIGUSR1) == 0, "kill: %s", strerror(errno));
		wait_hits(++want, "kill(getpid())");
		PT(pthread_kill(tids[round % THREADS], SIGUSR1));
		wait_hits(++want, "pthread_kill");
	}
	/* pthread_kill(t, 0) checks that t exists. */
	PT(pthread_kill(tids[0], 0));

	atomic_store(&stop, 1);
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(tids[i], NULL));

	pthread_t r;
	PT(pthread_create(&r, NULL, raiser, NULL));
	PT(pthread_join(r, NULL));
	PASS("signal_thread");
}

/*
 * A SIGTERM handler installed with sigaction runs while threads are busy:
 * the handler sets a flag, and the 4 threads (spinning, sleeping, waiting
 * on a mutex in turn) see it and stop. First the program sends SIGTERM to
 * itself with kill(getpid(), ...); then, with the argument "external", it
 * prints READY on stdout and waits up to 30 s for a SIGTERM from outside
 * (the test harness sends it).
 */
#include "check.h"
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#define THREADS 4

static volatile sig_atomic_t term;
static atomic_int handled;
static atomic_int saw[THREADS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void on_term(int sig, siginfo_t *info, void *ctx)
{
	(void)ctx;
	if (sig == SIGTERM && info->si_signo == SIGTERM) {
		term = 1;
		atomic_fetch_add(&handled, 1);
	}
}

static void *body(void *arg)
{
	int id = (int)(uintptr_t)arg;
	long n = 0;
	while (!term) {
		/* Thread 0 spins without a system call, thread 3 spins and
		 * yields: the main thread gets a CPU of 2 kthreads without
		 * preemption (preempt_spin tests that). */
		switch (id % 3) {
		case 0:
			spin_ns(100 * 1000);
			if (id != 0)
				sched_yield();
			break;
		case 1:
			usleep(200);
			break;
		default:
			pthread_mutex_lock(&lock);
			usleep(50);
			pthread_mutex_unlock(&lock);
			break;
		}
		n++;
	}
	atomic_store(&saw[id], 1);
	return (void *)(uintptr_t)n;
}

/* Runs threads until a SIGTERM arrives (from `send`, or from outside). */
static void round_trip(int external)
{
	pthread_t t[THREADS];
	term = 0;
	int before = atomic_load(&handled);
	for (int i = 0; i < THREADS; i++) {
		atomic_store(&saw[i], 0);
		PT(pthread_create(&t[i], NULL, body, (void *)(uintptr_t)i));
	}
	usleep(20 * 1000);
	if (external) {
		printf("READY\n");
		fflush(stdout);
		uint64_t end = now_ns() + 30ull * 1000000000ull;
		while (!term && now_ns() < end)
			usleep(1000);
		CHECK(term, "no SIGTERM from outside within 30 s");
	} else {
		CHECK(kill(getpid(), SIGTERM) == 0, "kill: %s", strerror(errno));
	}
	for (int i = 0; i < THREADS; i++) {
		void *n;
		PT(pthread_join(t[i], &n));
		CHECK(atomic_load(&saw[i]), "thread %d did not see the flag", i);
		CHECK((uintptr_t)n > 0, "thread %d did no work", i);
	}
	CHECK(atomic_load(&handled) == before + 1,
	      "the handler ran %d times for one SIGTERM",
	      atomic_load(&handled) - before);
	fprintf(stderr, "SIGTERM (%s) handled\n",
		external ? "from outside" : "kill(getpid())");
}

int main(int argc, char **argv)
{
	struct sigaction sa, old;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_term;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGTERM, &sa, NULL) == 0, "sigaction: %s",
	      strerror(errno));
	/* The handler reads back as installed. */
	CHECK(sigaction(SIGTERM, NULL, &old) == 0, "sigaction: %s",
	      strerror(errno));
	CHECK((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == on_term,
	      "sigaction reads back another handler");

	round_trip(0);
	if (argc > 1 && strcmp(argv[1], "external") == 0)
		round_trip(1);
	PASS("sigterm");
}

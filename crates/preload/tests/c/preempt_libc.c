/*
 * Threads preempted inside libc: 4 workers loop for 2 s over calls that
 * take glibc's internal locks (pthread_create/join: the dynamic linker's
 * TLS lock; malloc/free: arena locks; fprintf: the stdio lock of a shared
 * FILE; getenv/setenv: the environment lock) while 2 threads spin without
 * system calls, so a preemptive scheduler stops and moves the workers at
 * arbitrary points, lock holders included. Everything must finish with
 * exact counts: a worker stopped or moved while holding a libc lock must
 * not deadlock or corrupt the others, nor starve them: the workers must
 * do at least 200 iterations in all (Linux alone: tens of thousands).
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define WORKERS 4
#define SPINNERS 2
#define RUN_NS 2000000000ull

static atomic_int stop;
static FILE *sink;
static atomic_long created, lines;

static void *child(void *arg)
{
	return (void *)((uintptr_t)arg + 1);
}

static void *spinner(void *arg)
{
	(void)arg;
	uint64_t end = now_ns() + 2 * RUN_NS + 5000000000ull;
	while (!atomic_load_explicit(&stop, memory_order_relaxed) &&
	       now_ns() < end)
		;
	return NULL;
}

static void *worker(void *arg)
{
	int id = (int)(uintptr_t)arg;
	uint64_t end = now_ns() + RUN_NS;
	long iters = 0;
	char name[32];
	snprintf(name, sizeof name, "GINZA_TEST_W%d", id);
	while (now_ns() < end) {
		pthread_t t;
		void *ret;
		PT(pthread_create(&t, NULL, child, (void *)(uintptr_t)iters));
		PT(pthread_join(t, &ret));
		CHECK((uintptr_t)ret == (uintptr_t)iters + 1,
		      "worker %d: child returned %lu", id,
		      (unsigned long)(uintptr_t)ret);
		atomic_fetch_add(&created, 1);

		size_t n = 64 + (size_t)(iters % 4000);
		unsigned char *p = malloc(n);
		CHECK(p, "malloc");
		memset(p, id + 1, n);
		for (size_t i = 0; i < n; i += 61)
			CHECK(p[i] == id + 1, "worker %d: malloc'd byte changed",
			      id);
		free(p);

		CHECK(fprintf(sink, "worker %d line %ld\n", id, iters) > 0,
		      "fprintf");
		atomic_fetch_add(&lines, 1);

		char value[32];
		snprintf(value, sizeof value, "%ld", iters);
		CHECK(setenv(name, value, 1) == 0, "setenv");
		const char *got = getenv(name);
		CHECK(got && strcmp(got, value) == 0,
		      "worker %d: getenv gave %s, set %s", id, got ? got : "NULL",
		      value);
		iters++;
	}
	return (void *)(uintptr_t)iters;
}

int main(void)
{
	sink = fopen("/dev/null", "w");
	CHECK(sink, "fopen /dev/null: %s", strerror(errno));
	pthread_t s[SPINNERS], w[WORKERS];
	for (int i = 0; i < SPINNERS; i++)
		PT(pthread_create(&s[i], NULL, spinner, NULL));
	for (int i = 0; i < WORKERS; i++)
		PT(pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)i));
	long total = 0;
	for (int i = 0; i < WORKERS; i++) {
		void *iters;
		PT(pthread_join(w[i], &iters));
		CHECK((uintptr_t)iters > 0, "worker %d did nothing", i);
		total += (long)(uintptr_t)iters;
	}
	atomic_store(&stop, 1);
	for (int i = 0; i < SPINNERS; i++)
		PT(pthread_join(s[i], NULL));
	CHECK(atomic_load(&created) == total && atomic_load(&lines) == total,
	      "%ld iterations, %ld threads, %ld lines", total,
	      atomic_load(&created), atomic_load(&lines));
	/* Linux alone does tens of thousands here; a scheduler that lets
	 * the workers run only at long intervals beside the spinners falls
	 * far below this floor. */
	CHECK(total >= 200,
	      "only %ld iterations in 2 s by %d workers beside %d spinners",
	      total, WORKERS, SPINNERS);
	CHECK(fclose(sink) == 0, "fclose");
	fprintf(stderr, "%ld iterations by %d workers beside %d spinners\n",
		total, WORKERS, SPINNERS);
	PASS("preempt_libc");
}

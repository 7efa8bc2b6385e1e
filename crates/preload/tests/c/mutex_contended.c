/*
 * 8 threads increment a shared counter under one mutex, with a
 * non-atomic read-modify-write spread over a few instructions so a broken
 * mutex loses updates; the total must be exact. Some increments hold the
 * lock across sched_yield, so waiters really block. Static and dynamic
 * mutexes both.
 */
#include "check.h"
#include <pthread.h>

#define THREADS 8
#define ITERS 100000

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t d_lock;
static volatile long counter_s, counter_d;
static volatile int inside;

static void *body(void *arg)
{
	(void)arg;
	for (int i = 0; i < ITERS; i++) {
		pthread_mutex_t *m = (i & 1) ? &s_lock : &d_lock;
		volatile long *c = (i & 1) ? &counter_s : &counter_d;
		pthread_mutex_lock(m);
		if (m == &s_lock) {
			CHECK(inside == 0, "two threads inside the mutex");
			inside = 1;
		}
		long v = *c;
		if (i % 1000 == 0)
			sched_yield(); /* hold it while others pile up */
		*c = v + 1;
		if (m == &s_lock)
			inside = 0;
		pthread_mutex_unlock(m);
	}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	PT(pthread_mutex_init(&d_lock, NULL));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, NULL));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	long want = (long)THREADS * ITERS / 2;
	CHECK(counter_s == want, "static mutex counter %ld, expected %ld",
	      counter_s, want);
	CHECK(counter_d == want, "dynamic mutex counter %ld, expected %ld",
	      counter_d, want);
	PT(pthread_mutex_destroy(&d_lock));
	PASS("mutex_contended");
}

/*
 * 4 threads increment a counter under a pthread spinlock (a non-atomic
 * update, so a broken lock loses some); the total is exact; trylock on a
 * held spinlock is EBUSY.
 */
#include "check.h"
#include <pthread.h>

#define THREADS 4
#define ITERS 200000

static pthread_spinlock_t spin;
static volatile long counter;

static void *body(void *arg)
{
	(void)arg;
	for (int i = 0; i < ITERS; i++) {
		pthread_spin_lock(&spin);
		long v = counter;
		__asm__ __volatile__("" ::: "memory");
		counter = v + 1;
		pthread_spin_unlock(&spin);
	}
	return NULL;
}

static void *try_it(void *arg)
{
	*(int *)arg = pthread_spin_trylock(&spin);
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	PT(pthread_spin_init(&spin, PTHREAD_PROCESS_PRIVATE));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, NULL));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	CHECK(counter == (long)THREADS * ITERS, "counter %ld, expected %ld",
	      counter, (long)THREADS * ITERS);

	PT(pthread_spin_lock(&spin));
	int rc = -1;
	pthread_t o;
	PT(pthread_create(&o, NULL, try_it, &rc));
	PT(pthread_join(o, NULL));
	CHECK(rc == EBUSY, "trylock of a held spinlock: %d", rc);
	PT(pthread_spin_unlock(&spin));
	PT(pthread_spin_trylock(&spin));
	PT(pthread_spin_unlock(&spin));
	PT(pthread_spin_destroy(&spin));
	PASS("spinlock");
}

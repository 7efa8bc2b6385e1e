/*
 * 8 threads pass a barrier 1,000 times: in each round exactly one of them
 * gets PTHREAD_BARRIER_SERIAL_THREAD and the others 0, and nobody reaches
 * round r+1's work before everyone finished round r's.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>

#define THREADS 8
#define ROUNDS 1000

static pthread_barrier_t barrier;
static atomic_int serial[ROUNDS];
static atomic_int arrived[ROUNDS];

static void *body(void *arg)
{
	int id = (int)(uintptr_t)arg;
	for (int r = 0; r < ROUNDS; r++) {
		atomic_fetch_add(&arrived[r], 1);
		if ((r + id) % 97 == 0)
			sched_yield();
		int rc = pthread_barrier_wait(&barrier);
		CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD,
		      "barrier_wait returned %d", rc);
		if (rc == PTHREAD_BARRIER_SERIAL_THREAD)
			atomic_fetch_add(&serial[r], 1);
		CHECK(atomic_load(&arrived[r]) == THREADS,
		      "thread %d passed round %d with %d arrived", id, r,
		      atomic_load(&arrived[r]));
	}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	CHECK_RC(pthread_barrier_init(&barrier, NULL, 0), EINVAL);
	PT(pthread_barrier_init(&barrier, NULL, THREADS));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, (void *)(uintptr_t)i));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	for (int r = 0; r < ROUNDS; r++)
		CHECK(atomic_load(&serial[r]) == 1,
		      "round %d had %d serial threads", r,
		      atomic_load(&serial[r]));
	PT(pthread_barrier_destroy(&barrier));
	PASS("barrier");
}

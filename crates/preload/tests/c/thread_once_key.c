/*
 * pthread_once runs its routine exactly once though 16 threads race for it;
 * pthread_key_create/setspecific/getspecific keep one value per thread,
 * and the key's destructor runs at each thread's exit with that thread's
 * value (and not for threads that left the value NULL).
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>

#define THREADS 16
#define ROUNDS 50

static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_int once_runs;
static pthread_key_t key, key2;
static atomic_long destructed_sum;
static atomic_int destructed, destructed2;
static pthread_barrier_t start;

static void init_once(void)
{
	/* Widen the window in which the others could also run it. */
	spin_ns(2 * 1000 * 1000);
	atomic_fetch_add(&once_runs, 1);
}

static void destructor(void *v)
{
	long *p = v;
	atomic_fetch_add(&destructed_sum, *p);
	atomic_fetch_add(&destructed, 1);
	free(p);
}

static void destructor2(void *v)
{
	(void)v;
	atomic_fetch_add(&destructed2, 1);
}

static void *body(void *arg)
{
	long id = (long)(uintptr_t)arg;
	pthread_barrier_wait(&start);
	PT(pthread_once(&once, init_once));
	CHECK(atomic_load(&once_runs) == 1,
	      "pthread_once returned before its routine finished (%d runs)",
	      atomic_load(&once_runs));

	CHECK(pthread_getspecific(key) == NULL,
	      "thread %ld: a new thread's value is not NULL", id);
	long *mine = malloc(sizeof *mine);
	*mine = id + 1;
	PT(pthread_setspecific(key, mine));
	/* Only even threads set key2: its destructor runs for them only. */
	if (id % 2 == 0)
		PT(pthread_setspecific(key2, (void *)(uintptr_t)0x1234));
	for (int r = 0; r < ROUNDS; r++) {
		sched_yield();
		long *got = pthread_getspecific(key);
		CHECK(got == mine, "thread %ld: value changed to %p from %p",
		      id, (void *)got, (void *)mine);
		CHECK(*got == id + 1, "thread %ld: *value %ld", id, *got);
	}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	PT(pthread_key_create(&key, destructor));
	PT(pthread_key_create(&key2, destructor2));
	PT(pthread_barrier_init(&start, NULL, THREADS));
	/* The main thread's own value is separate from the threads'. */
	PT(pthread_setspecific(key, NULL));
	for (long i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, (void *)(uintptr_t)i));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	CHECK(atomic_load(&once_runs) == 1, "once routine ran %d times",
	      atomic_load(&once_runs));
	/* Destructors run before pthread_join returns. */
	CHECK(atomic_load(&destructed) == THREADS,
	      "destructor ran %d times, expected %d",
	      atomic_load(&destructed), THREADS);
	long want = (long)THREADS * (THREADS + 1) / 2;
	CHECK(atomic_load(&destructed_sum) == want,
	      "destructors saw values summing to %ld, expected %ld",
	      atomic_load(&destructed_sum), want);
	CHECK(atomic_load(&destructed2) == THREADS / 2,
	      "key2's destructor ran %d times, expected %d (NULL values "
	      "must not be destructed)", atomic_load(&destructed2),
	      THREADS / 2);
	CHECK(pthread_getspecific(key) == NULL, "main's value is not NULL");
	PT(pthread_key_delete(key));
	PT(pthread_key_delete(key2));
	PT(pthread_once(&once, init_once));
	CHECK(atomic_load(&once_runs) == 1, "once ran again");
	PASS("thread_once_key");
}

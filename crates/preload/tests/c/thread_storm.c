/*
 * 10,000 threads created and joined in batches; each returns a value made
 * from its index (half by return, half by pthread_exit), records its own
 * pthread_self(), and the main thread checks every value and identity.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>

#define THREADS 10000
#define BATCH 200

struct slot {
	int index;
	pthread_t self;
};

static struct slot slots[THREADS];
static atomic_int ran;

static uintptr_t value_of(int i)
{
	return (uintptr_t)i * 7919u + 13u;
}

static void *body(void *arg)
{
	struct slot *s = arg;
	s->self = pthread_self();
	atomic_fetch_add(&ran, 1);
	if (s->index % 2)
		pthread_exit((void *)value_of(s->index));
	return (void *)value_of(s->index);
}

int main(void)
{
	pthread_t tids[BATCH];
	for (int base = 0; base < THREADS; base += BATCH) {
		for (int k = 0; k < BATCH; k++) {
			slots[base + k].index = base + k;
			PT(pthread_create(&tids[k], NULL, body, &slots[base + k]));
		}
		for (int k = 0; k < BATCH; k++) {
			void *ret = NULL;
			int i = base + k;
			PT(pthread_join(tids[k], &ret));
			CHECK((uintptr_t)ret == value_of(i),
			      "thread %d returned %#lx, expected %#lx", i,
			      (unsigned long)(uintptr_t)ret,
			      (unsigned long)value_of(i));
			CHECK(pthread_equal(slots[i].self, tids[k]),
			      "thread %d: pthread_self() differs from the id "
			      "pthread_create gave", i);
			CHECK(!pthread_equal(slots[i].self, pthread_self()),
			      "thread %d has the main thread's id", i);
		}
	}
	CHECK(atomic_load(&ran) == THREADS, "%d threads ran, expected %d",
	      atomic_load(&ran), THREADS);
	PASS("thread_storm");
}

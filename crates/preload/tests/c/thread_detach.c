/*
 * Detached threads, both created detached (attribute) and detached after
 * creation (pthread_detach), each add to a counter; the main thread waits
 * for the exact total under a mutex + condvar, since it cannot join them.
 */
#include "check.h"
#include <pthread.h>

#define PER_KIND 1000

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static long done, sum;

static void *body(void *arg)
{
	long v = (long)(uintptr_t)arg;
	pthread_mutex_lock(&lock);
	done++;
	sum += v;
	pthread_cond_signal(&done_cv);
	pthread_mutex_unlock(&lock);
	return NULL;
}

int main(void)
{
	pthread_attr_t attr;
	int state = -1;
	PT(pthread_attr_init(&attr));
	PT(pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED));
	PT(pthread_attr_getdetachstate(&attr, &state));
	CHECK(state == PTHREAD_CREATE_DETACHED, "detach state %d", state);

	long want_sum = 0;
	for (long i = 1; i <= PER_KIND; i++) {
		pthread_t t;
		PT(pthread_create(&t, &attr, body, (void *)(uintptr_t)i));
		want_sum += i;
		PT(pthread_create(&t, NULL, body, (void *)(uintptr_t)(i * 1000)));
		PT(pthread_detach(t));
		want_sum += i * 1000;
	}
	PT(pthread_attr_destroy(&attr));

	struct timespec deadline;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 30;
	PT(pthread_mutex_lock(&lock));
	while (done < 2 * PER_KIND) {
		int rc = pthread_cond_timedwait(&done_cv, &lock, &deadline);
		CHECK(rc == 0 || rc == ETIMEDOUT, "timedwait: %s", strerror(rc));
		CHECK(rc == 0 || done == 2 * PER_KIND,
		      "after 30 s only %ld of %d detached threads finished",
		      done, 2 * PER_KIND);
	}
	CHECK(sum == want_sum, "sum %ld, expected %ld", sum, want_sum);
	PT(pthread_mutex_unlock(&lock));
	PASS("thread_detach");
}

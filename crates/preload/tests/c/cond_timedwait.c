/*
 * Timed condvar waits: with pthread_condattr_setclock(CLOCK_MONOTONIC)
 * and with the default CLOCK_REALTIME, a 20 ms wait nobody signals returns
 * ETIMEDOUT after at least 20 ms and before 200 ms, with the mutex held
 * again; a deadline already past times out at once; a wait that is
 * signalled in time returns 0 well before its deadline.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>

#define WAIT_NS (20 * 1000 * 1000ull)
#define LIMIT_NS (200 * 1000 * 1000ull)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static struct timespec deadline_in(clockid_t clock, uint64_t ns)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	ts.tv_sec += (time_t)(ns / 1000000000ull);
	ts.tv_nsec += (long)(ns % 1000000000ull);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

static void times_out(pthread_cond_t *cv, clockid_t clock, const char *what)
{
	for (int i = 0; i < 5; i++) {
		PT(pthread_mutex_lock(&lock));
		/* t0 before the deadline: an exact timer must not fail by the
		 * nanoseconds between the two readings. */
		uint64_t t0 = now_ns();
		struct timespec dl = deadline_in(clock, WAIT_NS);
		int rc;
		/* A spurious wakeup may return 0 early: wait again. */
		do
			rc = pthread_cond_timedwait(cv, &lock, &dl);
		while (rc == 0);
		uint64_t took = now_ns() - t0;
		CHECK(rc == ETIMEDOUT, "%s: returned %d (%s)", what, rc,
		      strerror(rc));
		/* The mutex is held again: trylock from here is EBUSY. */
		CHECK_RC(pthread_mutex_trylock(&lock), EBUSY);
		PT(pthread_mutex_unlock(&lock));
		/* Allow 1 ms less on CLOCK_REALTIME, another clock than the
		 * one measuring. */
		CHECK(took >= WAIT_NS - (clock == CLOCK_REALTIME ? 1000000 : 0),
		      "%s: timed out after %.3f ms, before the 20 ms deadline",
		      what, took / 1e6);
		CHECK(took < LIMIT_NS, "%s: timed out after %.3f ms (limit 200)",
		      what, took / 1e6);
		fprintf(stderr, "%s: ETIMEDOUT after %.3f ms\n", what, took / 1e6);
	}
	/* A deadline in the past: ETIMEDOUT at once. */
	PT(pthread_mutex_lock(&lock));
	struct timespec past;
	clock_gettime(clock, &past);
	past.tv_sec -= 1;
	uint64_t t0 = now_ns();
	CHECK_RC(pthread_cond_timedwait(cv, &lock, &past), ETIMEDOUT);
	CHECK(now_ns() - t0 < LIMIT_NS, "%s: a past deadline waited %.3f ms",
	      what, (now_ns() - t0) / 1e6);
	PT(pthread_mutex_unlock(&lock));
}

struct signaller {
	pthread_cond_t *cv;
	atomic_int flag;
};

static void *signal_soon(void *arg)
{
	struct signaller *s = arg;
	struct timespec d = {0, 5 * 1000 * 1000};
	nanosleep(&d, NULL);
	pthread_mutex_lock(&lock);
	atomic_store(&s->flag, 1);
	pthread_cond_signal(s->cv);
	pthread_mutex_unlock(&lock);
	return NULL;
}

static void signalled(pthread_cond_t *cv, clockid_t clock, const char *what)
{
	struct signaller s = {.cv = cv};
	pthread_t t;
	PT(pthread_mutex_lock(&lock));
	PT(pthread_create(&t, NULL, signal_soon, &s));
	struct timespec dl = deadline_in(clock, 10ull * 1000000000ull);
	uint64_t t0 = now_ns();
	int rc = 0;
	while (!atomic_load(&s.flag) && rc == 0)
		rc = pthread_cond_timedwait(cv, &lock, &dl);
	uint64_t took = now_ns() - t0;
	PT(pthread_mutex_unlock(&lock));
	PT(pthread_join(t, NULL));
	CHECK(rc == 0, "%s: a signalled wait returned %d (%s)", what, rc,
	      strerror(rc));
	CHECK(took < 2000ull * 1000000ull,
	      "%s: a wait signalled after 5 ms returned after %.3f ms", what,
	      took / 1e6);
}

int main(void)
{
	pthread_condattr_t a;
	pthread_cond_t mono, real;
	clockid_t got = -1;
	PT(pthread_condattr_init(&a));
	PT(pthread_condattr_setclock(&a, CLOCK_MONOTONIC));
	PT(pthread_condattr_getclock(&a, &got));
	CHECK(got == CLOCK_MONOTONIC, "getclock %d", (int)got);
	PT(pthread_cond_init(&mono, &a));
	PT(pthread_condattr_destroy(&a));
	PT(pthread_cond_init(&real, NULL));

	times_out(&mono, CLOCK_MONOTONIC, "CLOCK_MONOTONIC");
	times_out(&real, CLOCK_REALTIME, "CLOCK_REALTIME");
	signalled(&mono, CLOCK_MONOTONIC, "CLOCK_MONOTONIC");
	signalled(&real, CLOCK_REALTIME, "CLOCK_REALTIME");

	PT(pthread_cond_destroy(&mono));
	PT(pthread_cond_destroy(&real));
	PASS("cond_timedwait");
}

/*
 * errno and __thread variables belong to the thread that set them: 8
 * threads each set their own values and check them after blocking calls
 * (usleep, a contended mutex, sched_yield, a condvar wait) and during and
 * after long CPU loops that a preemptive scheduler interrupts. The
 * addresses of errno and of a __thread variable stay the same within a
 * thread and differ between threads.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define THREADS 8
#define ROUNDS 20

static __thread long tls_value;
static __thread char tls_name[32] = "unset";
static __thread int tls_initialized = 12345; /* from the TLS image */

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cv_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static atomic_int ready;
static uintptr_t errno_addr[THREADS], tls_addr[THREADS];

/* Not inlined, so each call computes the addresses afresh. */
static __attribute__((noinline)) long *tls_value_addr(void)
{
	return &tls_value;
}

static __attribute__((noinline)) int *errno_addr_now(void)
{
	return &errno;
}

static void expect(int id, const char *after)
{
	int e = errno;
	CHECK(e == 1000 + id, "thread %d: errno %d after %s, expected %d", id,
	      e, after, 1000 + id);
	CHECK(*(volatile long *)tls_value_addr() == (long)id * 31 + 7,
	      "thread %d: __thread value %ld after %s, expected %ld", id,
	      tls_value, after, (long)id * 31 + 7);
	char want[32];
	snprintf(want, sizeof want, "thread-%d", id);
	CHECK(strcmp(tls_name, want) == 0,
	      "thread %d: __thread name \"%s\" after %s", id, tls_name,
	      after);
	CHECK((uintptr_t)tls_value_addr() == tls_addr[id],
	      "thread %d: &tls_value moved after %s", id, after);
	CHECK((uintptr_t)errno_addr_now() == errno_addr[id],
	      "thread %d: &errno moved after %s", id, after);
}

/* Spins ~20 ms re-reading the thread's values, which must never change. */
static void spin_checking(int id)
{
	uint64_t end = now_ns() + 20 * 1000 * 1000;
	volatile long *v = tls_value_addr();
	long loops = 0;
	while (now_ns() < end) {
		for (int k = 0; k < 1000; k++) {
			CHECK(*tls_value_addr() == (long)id * 31 + 7,
			      "thread %d: __thread value %ld mid-loop", id, *v);
			CHECK(*errno_addr_now() == 1000 + id,
			      "thread %d: errno %d mid-loop", id, errno);
		}
		loops++;
	}
	(void)loops;
}

static void *body(void *arg)
{
	int id = (int)(uintptr_t)arg;
	CHECK(tls_initialized == 12345,
	      "thread %d: a __thread initializer gave %d", id,
	      tls_initialized);
	CHECK(tls_value == 0, "thread %d: a new thread's __thread is %ld", id,
	      tls_value);
	tls_value = (long)id * 31 + 7;
	snprintf(tls_name, sizeof tls_name, "thread-%d", id);
	tls_addr[id] = (uintptr_t)tls_value_addr();
	errno_addr[id] = (uintptr_t)errno_addr_now();
	errno = 1000 + id;
	atomic_fetch_add(&ready, 1);
	while (atomic_load(&ready) < THREADS)
		sched_yield();
	expect(id, "start");
	for (int r = 0; r < ROUNDS; r++) {
		usleep(500 + (unsigned)(id * 100));
		expect(id, "usleep");
		/* The main thread holds `busy` for a while: this waits. */
		pthread_mutex_lock(&busy);
		pthread_mutex_unlock(&busy);
		expect(id, "a contended mutex");
		sched_yield();
		expect(id, "sched_yield");
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_nsec += 200 * 1000;
		if (dl.tv_nsec >= 1000000000L) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&cv_lock);
		pthread_cond_timedwait(&cv, &cv_lock, &dl);
		pthread_mutex_unlock(&cv_lock);
		errno = 1000 + id; /* timedwait may set errno: restore */
		expect(id, "pthread_cond_timedwait");
		if (r % 5 == 0) {
			spin_checking(id);
			expect(id, "a 20 ms CPU loop");
		}
	}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	errno = 77;
	tls_value = -1;
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, (void *)(uintptr_t)i));
	for (int k = 0; k < 40; k++) {
		pthread_mutex_lock(&busy);
		usleep(2000);
		pthread_mutex_unlock(&busy);
		usleep(1000);
	}
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	for (int i = 0; i < THREADS; i++)
		for (int j = i + 1; j < THREADS; j++) {
			CHECK(tls_addr[i] != tls_addr[j],
			      "threads %d and %d share &tls_value", i, j);
			CHECK(errno_addr[i] != errno_addr[j],
			      "threads %d and %d share &errno", i, j);
		}
	CHECK(tls_value == -1, "main's __thread value became %ld", tls_value);
	errno = 77; /* the joins may have set errno */
	CHECK(tls_initialized == 12345, "main's initializer %d",
	      tls_initialized);
	CHECK(strcmp(tls_name, "unset") == 0, "main's name \"%s\"", tls_name);
	PASS("tls_errno");
}

/*
 * The dynamic linker's locks exclude other threads: 2 threads, made by
 * the same thread, call dl_iterate_phdr (its callbacks run under ld.so's
 * recursive write lock) and dlsym/dladdr (its load lock) 20,000 times
 * each at once. No two callbacks may overlap. glibc's recursive locks
 * name their holder by the tid in the thread's descriptor: threads that
 * share one would both enter, and the lock's count could be left held by
 * nobody, hanging the next dlsym or exit. Under Ginza that tid is one no
 * kernel thread has, so the calls that would ask the kernel about a thread
 * by its tid must answer otherwise: each thread first asks them about
 * itself (its affinity, its scheduling, its CPU clock).
 */
#include "check.h"
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define THREADS 2
#define ROUNDS 20000

static atomic_int inside;
static atomic_int overlaps;

static int visit(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)info;
	(void)size;
	(void)data;
	if (atomic_fetch_add(&inside, 1) != 0)
		atomic_fetch_add(&overlaps, 1);
	for (volatile int i = 0; i < 20; i++)
		;
	atomic_fetch_sub(&inside, 1);
	return 0;
}

static void *body(void *arg)
{
	(void)arg;
	cpu_set_t cpus;
	PT(pthread_getaffinity_np(pthread_self(), sizeof cpus, &cpus));
	CHECK(CPU_COUNT(&cpus) >= 1, "no CPU in the thread's affinity");
	int policy = -1;
	struct sched_param param = { .sched_priority = -1 };
	PT(pthread_getschedparam(pthread_self(), &policy, &param));
	CHECK(policy == SCHED_OTHER && param.sched_priority == 0,
	      "policy %d priority %d", policy, param.sched_priority);
	PT(pthread_setschedparam(pthread_self(), SCHED_OTHER, &param));
	/* No CPU clock per thread (ENOENT) is an answer too; one given works. */
	clockid_t clock;
	int rc = pthread_getcpuclockid(pthread_self(), &clock);
	CHECK(rc == 0 || rc == ENOENT, "pthread_getcpuclockid: %s",
	      strerror(rc));
	struct timespec ts;
	CHECK(rc != 0 || clock_gettime(clock, &ts) == 0,
	      "clock_gettime on the thread's CPU clock: %s", strerror(errno));
	for (int r = 0; r < ROUNDS; r++) {
		dl_iterate_phdr(visit, NULL);
		void *f = dlsym(RTLD_DEFAULT, "strlen");
		CHECK(f != NULL, "dlsym(strlen) failed: %s", dlerror());
		Dl_info info;
		CHECK(dladdr(f, &info) != 0, "dladdr of strlen failed");
	}
	return NULL;
}

int main(void)
{
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, NULL));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	CHECK(atomic_load(&overlaps) == 0,
	      "%d dl_iterate_phdr callbacks overlapped another thread's",
	      atomic_load(&overlaps));
	PASS("dl_lock");
}

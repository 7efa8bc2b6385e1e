/*
 * include/ginza.h from C. Its functions are weak: on plain Linux they are
 * absent (null) and the program still links and runs. Under Ginza
 * (GINZA_EXPECT_RUNTIME=1 from the harness) they must all be present,
 * ginza_app_stats returns 0 with sane counters, and ginza_current_core()
 * is a CPU this process may run on, from the main thread and from others.
 * Under iokerneld (GINZA_EXPECT_IOKERNEL=1) it has had a core granted.
 * Outside Ginza ginza_app_stats, if present, gives -1/ENOSYS and
 * ginza_current_core -1. ginza_yield and ginza_preempt_point are callable
 * from many threads at once.
 */
#include "check.h"
#include <ginza.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#define THREADS 4

static int expect_runtime;
static atomic_long progress;

static void check_core(const char *who)
{
	if (!ginza_current_core)
		return;
	int core = ginza_current_core();
	if (!expect_runtime) {
		CHECK(core == -1 || core >= 0, "%s: core %d", who, core);
		return;
	}
	CHECK(core >= 0, "%s: ginza_current_core() is %d under Ginza", who, core);
	long cpus = sysconf(_SC_NPROCESSORS_CONF);
	CHECK(core < cpus, "%s: core %d on a machine of %ld CPUs", who, core,
	      cpus);
}

static void *body(void *arg)
{
	(void)arg;
	check_core("a thread");
	for (int i = 0; i < 10000; i++) {
		if (ginza_yield)
			ginza_yield();
		else
			sched_yield();
		if (ginza_preempt_point)
			ginza_preempt_point();
		atomic_fetch_add(&progress, 1);
	}
	check_core("a thread, after yields");
	return NULL;
}

int main(void)
{
	const char *e = getenv("GINZA_EXPECT_RUNTIME");
	expect_runtime = e && strcmp(e, "1") == 0;
	int present = (ginza_yield != NULL) + (ginza_preempt_point != NULL) +
		      (ginza_current_core != NULL) + (ginza_app_stats != NULL);
	fprintf(stderr, "ginza.h: %d of 4 functions present, runtime %s\n",
		present, expect_runtime ? "expected" : "not expected");
	if (expect_runtime)
		CHECK(present == 4, "only %d of the 4 ginza.h functions resolve "
		      "under Ginza", present);

	if (ginza_app_stats) {
		struct ginza_app_stats st;
		memset(&st, 0xff, sizeof st);
		errno = 0;
		int rc = ginza_app_stats(&st);
		if (expect_runtime) {
			CHECK(rc == 0, "ginza_app_stats: %d (errno %d, %s)", rc,
			      errno, strerror(errno));
			CHECK(st.kthreads >= 1 && st.kthreads < 4096,
			      "ginza_app_stats: kthreads %u", st.kthreads);
			CHECK(st.cores_now <= st.kthreads,
			      "ginza_app_stats: %u cores for %u kthreads",
			      st.cores_now, st.kthreads);
			fprintf(stderr,
				"stats: kthreads %u cores_now %u uthreads %llu "
				"preemptions %llu steals %llu parks %llu "
				"grants %llu\n",
				st.kthreads, st.cores_now,
				(unsigned long long)st.uthreads,
				(unsigned long long)st.preemptions,
				(unsigned long long)st.steals,
				(unsigned long long)st.parks,
				(unsigned long long)st.grants);
		} else {
			CHECK(rc == -1 && errno == ENOSYS,
			      "ginza_app_stats outside Ginza: %d, errno %d", rc,
			      errno);
		}
	}
	check_core("the main thread");

	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		PT(pthread_create(&t[i], NULL, body, NULL));
	for (int i = 0; i < THREADS; i++)
		PT(pthread_join(t[i], NULL));
	CHECK(atomic_load(&progress) == THREADS * 10000L, "progress %ld",
	      atomic_load(&progress));

	if (expect_runtime && ginza_app_stats) {
		struct ginza_app_stats st;
		PT(ginza_app_stats(&st));
		CHECK(st.uthreads >= THREADS,
		      "ginza_app_stats: %llu uthreads after %d threads ran",
		      (unsigned long long)st.uthreads, THREADS);
		/* Under iokerneld the cores it runs on were granted. */
		const char *io = getenv("GINZA_EXPECT_IOKERNEL");
		if (io && strcmp(io, "1") == 0)
			CHECK(st.grants >= 1,
			      "ginza_app_stats: no grant under iokerneld");
	}
	PASS("ginza_api");
}

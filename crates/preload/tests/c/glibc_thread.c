/*
 * Threads made by glibc's own pthread_create, behind the preload
 * library's back, as jemalloc makes its background threads (it finds
 * pthread_create with dlsym(RTLD_NEXT), which from a library loaded after
 * Ginza's is glibc's; Redis turns them on). Such a kernel thread inherits
 * the kernel state of the kthread that made it; it must still be served
 * as a thread of its own: while the main thread spins in C code on its
 * kthread, the glibc threads sleep, yield, lock and wait on condvars
 * a thousand times and more, then hand a token back and forth with the main
 * thread through one condvar. Exact counts; each thread keeps its own
 * errno and __thread values; pthread_join and pthread_self work on them.
 * Four times over, with new threads each time. First of all, before such
 * a thread calls anything, it is sent SIGURG (Ginza's preemption signal;
 * Linux ignores it) 50 times while it spins: it must not be taken for a
 * preempted program thread either.
 */
#include "check.h"
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define GLIBC_THREADS 2
#define ROUNDS 1500
#define PINGS 2000
#define TIMES 4

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *,
			 void *(*)(void *), void *);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static long counted;
/* Whose turn it is in the ping-pong: 0 the main thread, 1 + i thread i. */
static int turn;
static long pings[GLIBC_THREADS];
static __thread long mine;
static pthread_t self_seen[GLIBC_THREADS];

static create_fn glibc_create(void)
{
	void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
	CHECK(libc != NULL, "dlopen libc.so.6: %s", dlerror());
	create_fn f = (create_fn)dlsym(libc, "pthread_create");
	CHECK(f != NULL, "dlsym pthread_create: %s", dlerror());
	return f;
}

/* The first glibc thread's kernel tid once it spins, and its release. */
static atomic_int spinner_tid;
static atomic_int spinner_released;

static void *glibc_thread(void *arg)
{
	int id = (int)(uintptr_t)arg;
	if (id == 0) {
		/* No call into any library before the signals: a raw system
		 * call, then a spin in this program's own code. */
		atomic_store(&spinner_tid, (int)syscall(SYS_gettid));
		while (!atomic_load(&spinner_released))
			__asm__ __volatile__("pause" ::: "memory");
	}
	self_seen[id] = pthread_self();
	mine = 1000 + id;
	/* Phase 1: blocking calls while the main thread spins in C code. */
	for (int i = 0; i < ROUNDS; i++) {
		PT(pthread_mutex_lock(&lock));
		counted++;
		PT(pthread_cond_broadcast(&cv));
		PT(pthread_mutex_unlock(&lock));
		if (i % 3 == 0)
			usleep(20);
		else if (i % 3 == 1)
			sched_yield();
		else {
			struct timespec ts = { 0, 10000 };
			nanosleep(&ts, NULL);
		}
		errno = 7000 + id;
		CHECK(mine == 1000 + id, "__thread value %ld in thread %d", mine,
		      id);
		CHECK(errno == 7000 + id, "errno %d in thread %d", errno, id);
	}
	/* Phase 2: the token passes main → 0 → 1 → main through one condvar. */
	PT(pthread_mutex_lock(&lock));
	for (int i = 0; i < PINGS; i++) {
		while (turn != 1 + id)
			PT(pthread_cond_wait(&cv, &lock));
		pings[id]++;
		turn = (id + 1 == GLIBC_THREADS) ? 0 : 2 + id;
		PT(pthread_cond_broadcast(&cv));
	}
	PT(pthread_mutex_unlock(&lock));
	return (void *)(uintptr_t)(42 + id);
}

static void one_time(create_fn create)
{
	pthread_t t[GLIBC_THREADS];
	counted = 0;
	turn = 0;
	for (int i = 0; i < GLIBC_THREADS; i++)
		pings[i] = 0;
	mine = 1;
	atomic_store(&spinner_tid, 0);
	atomic_store(&spinner_released, 0);
	for (int i = 0; i < GLIBC_THREADS; i++)
		PT(create(&t[i], NULL, glibc_thread, (void *)(uintptr_t)i));
	uint64_t wait_until = now_ns() + 10ull * 1000000000ull;
	while (atomic_load(&spinner_tid) == 0)
		CHECK(now_ns() < wait_until, "the glibc thread did not start in 10 s");
	for (int i = 0; i < 50; i++) {
		CHECK(syscall(SYS_tgkill, getpid(), atomic_load(&spinner_tid),
			      SIGURG) == 0,
		      "tgkill: %s", strerror(errno));
		spin_ns(100000);
	}
	atomic_store(&spinner_released, 1);
	/* Keep this thread's kthread busy in C code meanwhile. */
	uint64_t deadline = now_ns() + 20ull * 1000000000ull;
	for (;;) {
		PT(pthread_mutex_lock(&lock));
		long n = counted;
		PT(pthread_mutex_unlock(&lock));
		if (n == (long)GLIBC_THREADS * ROUNDS)
			break;
		CHECK(now_ns() < deadline, "only %ld of %d rounds in 20 s", n,
		      GLIBC_THREADS * ROUNDS);
		spin_ns(200000);
	}
	errno = 5;
	PT(pthread_mutex_lock(&lock));
	long mine_pings = 0;
	for (int i = 0; i < PINGS; i++) {
		turn = 1;
		PT(pthread_cond_broadcast(&cv));
		while (turn != 0)
			PT(pthread_cond_wait(&cv, &lock));
		mine_pings++;
	}
	PT(pthread_mutex_unlock(&lock));
	CHECK(errno == 5, "main's errno %d", errno);
	CHECK(mine == 1, "main's __thread value %ld", mine);
	for (int i = 0; i < GLIBC_THREADS; i++) {
		void *ret = NULL;
		PT(pthread_join(t[i], &ret));
		CHECK(ret == (void *)(uintptr_t)(42 + i), "thread %d returned %p",
		      i, ret);
		CHECK(pthread_equal(self_seen[i], t[i]),
		      "thread %d: pthread_self %lx, created %lx", i,
		      (unsigned long)self_seen[i], (unsigned long)t[i]);
		CHECK(pings[i] == PINGS, "thread %d saw %ld pings", i,
		      pings[i]);
	}
	CHECK(mine_pings == PINGS, "main saw %ld pings", mine_pings);
	CHECK(counted == (long)GLIBC_THREADS * ROUNDS, "counted %ld", counted);
}

int main(void)
{
	create_fn create = glibc_create();
	for (int i = 0; i < TIMES; i++)
		one_time(create);
	PASS("glibc_thread");
}

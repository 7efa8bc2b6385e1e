/*
 * A program's own SIGSEGV handler of a common kind
 * (SA_SIGINFO | SA_NODEFER | SA_RESETHAND, no alternate stack).
 *
 * Without arguments: a thread writes to a page it made inaccessible; the
 * handler sees the fault's address, makes the page writable and returns,
 * so the write is made again and succeeds. Twice, in two threads, with the
 * handler installed again in between (SA_RESETHAND removes it).
 *
 * With "overflow": a thread with a 64 KiB stack recurses without end. The
 * handler, if it ever runs, says so and exits 7. On Linux it cannot run
 * (there is no stack left to run it on, and no alternate stack) and the
 * kernel kills the process with SIGSEGV; under Ginza the runtime names
 * the overflow and aborts first (c_suite.rs checks which).
 */
#include "check.h"
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

static char *page;
static long page_size;
static volatile sig_atomic_t faults;
static void *volatile fault_addr;

static void on_segv(int sig, siginfo_t *info, void *ctx)
{
	(void)sig;
	(void)ctx;
	faults++;
	fault_addr = info->si_addr;
	mprotect(page, page_size, PROT_READ | PROT_WRITE);
}

static void on_segv_overflow(int sig)
{
	(void)sig;
	static const char msg[] = "the program's handler ran\n";
	write(2, msg, sizeof msg - 1);
	_exit(7);
}

static void install(void (*h)(int, siginfo_t *, void *))
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sigemptyset(&sa.sa_mask);
	sa.sa_sigaction = h;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESETHAND;
	CHECK(sigaction(SIGSEGV, &sa, NULL) == 0, "%s", strerror(errno));
}

static void *write_page(void *arg)
{
	(void)arg;
	page[123] = 42;
	return NULL;
}

/* Deep enough to exhaust any stack: the depth comes from outside. */
static volatile int limit = 1 << 30;

static int recurse(int depth)
{
	volatile char frame[512];
	frame[0] = (char)depth;
	if (depth == limit)
		return 0;
	return recurse(depth + 1) + frame[0];
}

static void *overflow(void *arg)
{
	(void)arg;
	return (void *)(long)recurse(0);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "overflow") == 0) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sigemptyset(&sa.sa_mask);
		sa.sa_handler = on_segv_overflow;
		sa.sa_flags = SA_NODEFER | SA_RESETHAND;
		CHECK(sigaction(SIGSEGV, &sa, NULL) == 0, "%s", strerror(errno));
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setstacksize(&attr, 64 << 10);
		pthread_t t;
		CHECK_RC(pthread_create(&t, &attr, overflow, NULL), 0);
		pthread_join(t, NULL);
		CHECK(0, "the recursion returned");
	}
	page_size = sysconf(_SC_PAGESIZE);
	page = mmap(NULL, page_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
		    -1, 0);
	CHECK(page != MAP_FAILED, "%s", strerror(errno));
	for (int round = 1; round <= 2; round++) {
		install(on_segv);
		pthread_t t;
		CHECK_RC(pthread_create(&t, NULL, write_page, NULL), 0);
		CHECK_RC(pthread_join(t, NULL), 0);
		CHECK(faults == round, "%d faults after round %d", (int)faults,
		      round);
		CHECK(fault_addr == page + 123, "fault at %p, page at %p",
		      fault_addr, (void *)page);
		CHECK(page[123] == 42, "the write was not made again");
		page[123] = 0;
		mprotect(page, page_size, PROT_NONE);
	}
	struct sigaction now;
	CHECK(sigaction(SIGSEGV, NULL, &now) == 0, "%s", strerror(errno));
	CHECK(now.sa_handler == SIG_DFL, "SA_RESETHAND left a handler");
	printf("ok fault_handler\n");
	return 0;
}

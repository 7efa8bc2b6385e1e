/*
 * ginza.h: the small C API of Ginza for programs run by `ginza run`
 * (libginza_preload.so, loaded with LD_PRELOAD).
 *
 * Every function is declared weak, so a program that includes this header
 * links and runs on plain Linux too: there the functions' addresses are
 * null, and the program checks before calling, e.g.
 *
 *     if (ginza_yield)
 *         ginza_yield();
 *     else
 *         sched_yield();
 *
 * Under `ginza run` the preload library defines them, and the dynamic
 * linker resolves the weak references to its definitions.
 */
#ifndef GINZA_H
#define GINZA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The calling application's counters, as ginza_app_stats() fills them.
 * Fields may be added only in place of `reserved`, so the size stays fixed.
 */
struct ginza_app_stats {
	uint32_t kthreads;       /* kthreads of the runtime */
	uint32_t cores_now;      /* cores the application holds now */
	uint64_t uthreads;       /* uthreads (program threads) started so far */
	uint64_t preemptions;    /* preemptions of its uthreads */
	uint64_t steals;         /* work taken from another kthread */
	uint64_t parks;          /* times a kthread parked (gave its core back) */
	uint64_t grants;         /* cores granted by iokerneld (0 standalone) */
	uint64_t reserved[8];
};

/* A point where the runtime may preempt the calling thread if it is due. */
__attribute__((weak)) void ginza_preempt_point(void);

/* Gives the CPU to another runnable thread of the program, if any. */
__attribute__((weak)) void ginza_yield(void);

/* The CPU the calling thread runs on; -1 outside Ginza. */
__attribute__((weak)) int ginza_current_core(void);

/*
 * Fills *out with the application's counters: 0, or -1 with errno ENOSYS
 * when the program does not run under Ginza.
 */
__attribute__((weak)) int ginza_app_stats(struct ginza_app_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* GINZA_H */

// Command threadops measures Go's thread operations for `ginza bench threadops`.
//
// It runs with one P (GOMAXPROCS=1) so that every goroutine shares one OS
// thread's worth of scheduling, like one Ginza kthread; the caller pins the
// whole process to one CPU. Each operation is timed over -samples samples of
// -iters operations, and the median ns/op of each is printed as one JSON line:
//
//	{"spawn_join":N,"yield_pingpong":N,"condvar_pingpong":N,"mutex":N}
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// sink keeps results alive so the compiler cannot drop the work.
var sink uint64

// spawnJoin starts a goroutine that returns a value over a channel and waits
// for it, one at a time.
func spawnJoin(n int) (time.Duration, int) {
	ch := make(chan uint64, 1)
	start := time.Now()
	for i := 0; i < n; i++ {
		go func(v uint64) { ch <- v }(uint64(i))
		sink += <-ch
	}
	return time.Since(start), n
}

// partnerReady starts the partner goroutine and waits until it runs, so the
// timed part holds hand-offs only.
func partnerReady(partner func(ready *atomic.Bool)) chan struct{} {
	var ready atomic.Bool
	done := make(chan struct{})
	go func() {
		partner(&ready)
		close(done)
	}()
	for !ready.Load() {
		runtime.Gosched()
	}
	return done
}

// yieldPingPong: two goroutines alternate on a turn variable, each calling
// runtime.Gosched while it is not its turn. One op = one hand-off.
func yieldPingPong(n int) (time.Duration, int) {
	rounds := (n + 1) / 2
	var turn atomic.Int32
	done := partnerReady(func(ready *atomic.Bool) {
		ready.Store(true)
		for i := 0; i < rounds; i++ {
			for turn.Load() != 1 {
				runtime.Gosched()
			}
			turn.Store(0)
		}
	})
	start := time.Now()
	for i := 0; i < rounds; i++ {
		turn.Store(1)
		for turn.Load() != 0 {
			runtime.Gosched()
		}
	}
	elapsed := time.Since(start)
	<-done
	return elapsed, 2 * rounds
}

// condvarPingPong: two goroutines hand a token back and forth with
// sync.Mutex + sync.Cond. One op = one hand-off.
func condvarPingPong(n int) (time.Duration, int) {
	rounds := (n + 1) / 2
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	turn := 0
	done := partnerReady(func(ready *atomic.Bool) {
		ready.Store(true)
		for i := 0; i < rounds; i++ {
			mu.Lock()
			for turn != 1 {
				cond.Wait()
			}
			turn = 0
			cond.Signal()
			mu.Unlock()
		}
	})
	start := time.Now()
	for i := 0; i < rounds; i++ {
		mu.Lock()
		turn = 1
		cond.Signal()
		for turn != 0 {
			cond.Wait()
		}
		mu.Unlock()
	}
	elapsed := time.Since(start)
	<-done
	return elapsed, 2 * rounds
}

// mutex: uncontended Lock+Unlock around an increment.
func mutex(n int) (time.Duration, int) {
	var mu sync.Mutex
	var v uint64
	start := time.Now()
	for i := 0; i < n; i++ {
		mu.Lock()
		v++
		mu.Unlock()
	}
	elapsed := time.Since(start)
	sink += v
	return elapsed, n
}

// median of per-sample ns/op; one warm-up sample is run and discarded.
func median(op func(int) (time.Duration, int), iters, samples int) float64 {
	op(iters)
	per := make([]float64, 0, samples)
	for s := 0; s < samples; s++ {
		d, ops := op(iters)
		per = append(per, float64(d.Nanoseconds())/float64(ops))
	}
	sort.Float64s(per)
	m := len(per) / 2
	if len(per)%2 == 1 {
		return per[m]
	}
	return (per[m-1] + per[m]) / 2
}

func main() {
	iters := flag.Int("iters", 10000, "operations per sample")
	samples := flag.Int("samples", 15, "samples per operation (the median is reported)")
	lock := flag.Bool("lockosthread", false, "lock the measuring goroutine to its OS thread (slows every switch: hand-offs then cross OS threads)")
	flag.Parse()
	if *iters < 1 || *samples < 1 {
		fmt.Fprintln(os.Stderr, "threadops: -iters and -samples must be at least 1")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(1)
	if *lock {
		runtime.LockOSThread()
	}
	out := map[string]float64{
		"spawn_join":       median(spawnJoin, *iters, *samples),
		"yield_pingpong":   median(yieldPingPong, *iters, *samples),
		"condvar_pingpong": median(condvarPingPong, *iters, *samples),
		"mutex":            median(mutex, *iters, *samples),
	}
	if sink == 42 {
		fmt.Fprintln(os.Stderr, "")
	}
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "threadops:", err)
		os.Exit(1)
	}
	fmt.Println(string(line))
}

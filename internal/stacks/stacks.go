// Package stacks reads the goroutine stacks of the running process, for
// tests that must wait until goroutines are parked at a given call (a
// single-flight renewal, a cache fetch) instead of sleeping. Test support
// only: it depends on the wording of runtime.Stack's dump.
package stacks

import (
	"runtime"
	"strings"
)

// BlockedIn counts the goroutines blocked in a select or a channel
// operation with fn in their stack, e.g. "consumer.(*MixCache).Get(".
func BlockedIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		blocked := strings.Contains(head, "[select") || strings.Contains(head, "[chan ")
		if blocked && strings.Contains(g, fn) {
			count++
		}
	}
	return count
}

package reporter

import (
	"container/heap"
	"time"
)

// fifo is a slice-backed FIFO of jobs.
type fifo struct {
	items []*job
	head  int
}

func (q *fifo) push(j *job) {
	if q.head > 0 && q.head >= len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items = q.items[:n]
		q.head = 0
	}
	q.items = append(q.items, j)
}

func (q *fifo) len() int { return len(q.items) - q.head }

// all returns the queued jobs, oldest first (valid until the next push or pop).
func (q *fifo) all() []*job { return q.items[q.head:] }

// peek is the oldest queued job (nil when empty).
func (q *fifo) peek() *job {
	if q.head == len(q.items) {
		return nil
	}
	return q.items[q.head]
}

func (q *fifo) pop() *job {
	if q.head == len(q.items) {
		return nil
	}
	j := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return j
}

// delayQueue holds jobs waiting for their retry time, earliest first.
type delayQueue []*job

func (d delayQueue) Len() int           { return len(d) }
func (d delayQueue) Less(i, j int) bool { return d[i].readyAt.Before(d[j].readyAt) }
func (d delayQueue) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *delayQueue) Push(x any)        { *d = append(*d, x.(*job)) }
func (d *delayQueue) Pop() any {
	old := *d
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*d = old[:len(old)-1]
	return j
}

func (d *delayQueue) add(j *job) { heap.Push(d, j) }

// init restores the heap order after jobs were taken out.
func (d *delayQueue) init() { heap.Init(d) }

// due pops the jobs whose time has come into out.
func (d *delayQueue) due(now time.Time, out *fifo) {
	for len(*d) > 0 && !(*d)[0].readyAt.After(now) {
		out.push(heap.Pop(d).(*job))
	}
}

// next is the earliest retry time, zero when empty.
func (d delayQueue) next() time.Time {
	if len(d) == 0 {
		return time.Time{}
	}
	return d[0].readyAt
}

package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// mixWaiter fetches, in the background, the mixes that held events wait
// for: one goroutine per mix, retrying (MixCache.Get) until the mix is
// served or gets a verdict. Run owns it: stop ends and waits for every
// goroutine.
type mixWaiter struct {
	cache  *MixCache
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	waiting map[int64]bool
	fatal   error

	notify chan struct{} // a fetch ended (capacity 1)
	gen    atomic.Int64  // fetches ended so far
}

func newMixWaiter(parent context.Context, cache *MixCache) *mixWaiter {
	ctx, cancel := context.WithCancel(parent)
	return &mixWaiter{cache: cache, ctx: ctx, cancel: cancel, waiting: map[int64]bool{}, notify: make(chan struct{}, 1)}
}

// wait starts fetching mix id unless it is being fetched.
func (w *mixWaiter) wait(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting[id] || w.ctx.Err() != nil {
		return
	}
	w.waiting[id] = true
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		_, err := w.cache.Get(w.ctx, id)
		w.mu.Lock()
		delete(w.waiting, id)
		if errors.Is(err, ErrInvalidConfig) && w.fatal == nil {
			w.fatal = err
		}
		w.mu.Unlock()
		w.gen.Add(1)
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}()
}

// isWaiting reports whether mix id is being fetched in the background.
func (w *mixWaiter) isWaiting(id int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waiting[id]
}

// err is the configuration error a fetch ended with (the role stops), or nil.
func (w *mixWaiter) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatal
}

// stop cancels the fetches and waits for them.
func (w *mixWaiter) stop() {
	w.cancel()
	w.wg.Wait()
}

// applyMarks sets the offsets and metadata of marks in a transaction's
// offset commit (kgo.PreTxnCommitFnContext), adding the partitions franz-go
// left out (nothing new polled there since its last commit).
func applyMarks(req *kmsg.TxnOffsetCommitRequest, marks map[tpKey]commitMark) {
	seen := make(map[tpKey]bool, len(marks))
	for i := range req.Topics {
		t := &req.Topics[i]
		for j := range t.Partitions {
			p := &t.Partitions[j]
			tp := tpKey{t.Topic, p.Partition}
			m, ok := marks[tp]
			if !ok {
				continue
			}
			seen[tp] = true
			if p.Offset != m.offset {
				p.Offset, p.LeaderEpoch = m.offset, -1
			}
			if m.meta != "" {
				p.Metadata = kmsg.StringPtr(m.meta)
			}
		}
	}
	for tp, m := range marks {
		if seen[tp] {
			continue
		}
		ti := -1
		for i := range req.Topics {
			if req.Topics[i].Topic == tp.topic {
				ti = i
			}
		}
		if ti < 0 {
			t := kmsg.NewTxnOffsetCommitRequestTopic()
			t.Topic = tp.topic
			req.Topics = append(req.Topics, t)
			ti = len(req.Topics) - 1
		}
		p := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset, p.LeaderEpoch = tp.part, m.offset, -1
		if m.meta != "" {
			p.Metadata = kmsg.StringPtr(m.meta)
		} else {
			p.Metadata = kmsg.StringPtr(req.MemberID)
		}
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, p)
	}
}

// lostParts collects partitions revoked or lost by rebalances (franz-go's
// callbacks) until Run's goroutine applies them.
type lostParts struct {
	mu   sync.Mutex
	lost map[tpKey]bool
}

func (l *lostParts) note(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		l.lost = map[tpKey]bool{}
	}
	for t, ps := range m {
		for _, p := range ps {
			l.lost[tpKey{t, p}] = true
		}
	}
}

func (l *lostParts) takeAll() map[tpKey]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.lost
	l.lost = nil
	return m
}

package consumer

import (
	"context"
	"errors"
	"sync"
)

// resolve fetches the missing mixes (at most conc at once), waiting until
// waitCtx ends. A 404 is remembered by the cache and is not an error here.
func (p *processor) resolve(waitCtx context.Context, ids []int64) error {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []int64
		first  error
	)
	sem := make(chan struct{}, p.conc)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := p.cache.Get(waitCtx, id); err != nil && !rejectsEvents(err) {
				mu.Lock()
				failed = append(failed, id)
				if first == nil || errors.Is(err, ErrInvalidConfig) {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return p.waitErr(waitCtx, first, failed)
	}
	return nil
}

func (p *processor) waitErr(waitCtx context.Context, err error, ids []int64) error {
	if errors.Is(err, ErrInvalidConfig) {
		return err
	}
	if waitCtx.Err() != nil {
		return &errWaitTooLong{mixIDs: ids}
	}
	return err
}

// rejectsEvents reports whether a MixCache error is a verdict on the mix
// that rejects its events (404, or declared unavailable), not a failure.
func rejectsEvents(err error) bool {
	return errors.Is(err, ErrUnknownMix) || errors.Is(err, ErrMixUnavailable)
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

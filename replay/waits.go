package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultKafkaTimeout is Config.KafkaTimeout's default.
const DefaultKafkaTimeout = 30 * time.Second

// KafkaTimeoutError is the error of a run that waited on Kafka longer than
// Config.KafkaTimeout: a broker that does not answer (frozen, cut off)
// ends the run instead of holding it forever. Nothing is lost: every answer
// the run got is on record or the report is posted again by a re-run of
// the same id, labelled in doubt.
type KafkaTimeoutError struct {
	Brokers []string
	Timeout time.Duration
	Step    string // what the run waited for
	Err     error  // the step's own error
}

func (e *KafkaTimeoutError) Error() string {
	return fmt.Sprintf("replay: Kafka (%s) did not answer within %s (--kafka-timeout) while %s: %v",
		strings.Join(e.Brokers, ","), e.Timeout, e.Step, e.Err)
}

func (e *KafkaTimeoutError) Unwrap() error { return e.Err }

// errWaitOver is the cause of a step's context whose KafkaTimeout ran out.
var errWaitOver = errors.New("kafka wait over")

// readIdle is how long a read gets nothing before it asks whether the rest
// of its ranges holds no record.
const readIdle = 3 * time.Second

// waits bounds each wait of a run on Kafka by timeout.
type waits struct {
	timeout time.Duration
	brokers []string
	idle    time.Duration // readIdle; shorter in tests
}

// do runs one step against Kafka (an admin request, a produce's
// acknowledgement) with ctx bounded by the timeout, and waits for it no
// longer than that: franz-go dials a new connection with a dial timeout of
// its own, whatever the context says (a frozen broker held a 2 s request
// for 19 s), and holds a record whose produce request is not answered. When
// the bound, not ctx, ended the step, the error is a *KafkaTimeoutError
// naming it. A step given up on finishes in the background (its own
// timeouts end it); fn must not write what the caller reads after an error.
func (w waits) do(ctx context.Context, step string, fn func(context.Context) error) error {
	sctx, cancel := context.WithTimeoutCause(ctx, w.timeout, errWaitOver)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(sctx) }() // owned by this call; past the bound, by franz-go's own timeouts
	select {
	case err := <-done:
		if err == nil || ctx.Err() != nil || !errors.Is(context.Cause(sctx), errWaitOver) {
			return err
		}
		return w.timedOut(step, err)
	case <-sctx.Done():
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return w.timedOut(step, context.DeadlineExceeded)
	}
}

// timedOut is the error of step when its bound ran out.
func (w waits) timedOut(step string, err error) error {
	return &KafkaTimeoutError{Brokers: w.brokers, Timeout: w.timeout, Step: step, Err: err}
}

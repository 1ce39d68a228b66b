package gateway

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// Errors of a request body cut by the gateway's read limits.
var (
	// errSlowBody: after the grace period the body arrived slower than
	// Config.MinBodyRate on average.
	errSlowBody = errors.New("request body slower than the minimum rate")
	// errReadTimeout: the body was not complete within Config.ReadTimeout.
	errReadTimeout = errors.New("request body not complete within the read timeout")
)

// bodyReader enforces the minimum body rate and the per-request read
// deadline on a request body. Before each read it sets the connection's read
// deadline (http.ResponseController) to the moment the bytes received so far
// would fall under the minimum rate, capped by the request's deadline, so a
// client that stops sending is cut at that moment, not when it resumes.
//
// The rate is an average since the request began: after grace, a body of n
// bytes must have arrived by start + grace + n/minRate. A body that goes
// quiet for a while is fine as long as its average stays above the rate.
type bodyReader struct {
	r        io.Reader
	rc       *http.ResponseController
	start    time.Time
	deadline time.Time     // start + ReadTimeout
	grace    time.Duration // no rate is asked for before start + grace
	minRate  float64       // bytes per second
	n        int64         // bytes read so far
	noConnDL bool          // the connection has no read deadlines: check between reads only
	now      func() time.Time
}

func newBodyReader(w http.ResponseWriter, body io.Reader, start time.Time, cfg *Config) *bodyReader {
	return &bodyReader{
		r: body, rc: http.NewResponseController(w), start: start,
		deadline: start.Add(cfg.ReadTimeout), grace: cfg.BodyGrace, minRate: float64(cfg.MinBodyRate),
		now: time.Now,
	}
}

// due is the moment the bytes read so far fall under the minimum rate, or
// the request's deadline if that comes first.
func (b *bodyReader) due() time.Time {
	t := b.start.Add(b.grace + time.Duration(float64(b.n)/b.minRate*float64(time.Second)))
	if t.After(b.deadline) {
		return b.deadline
	}
	return t
}

// cause says which limit a read that ended at now broke.
func (b *bodyReader) cause(now time.Time) error {
	if !now.Before(b.deadline) {
		return errReadTimeout
	}
	return errSlowBody
}

func (b *bodyReader) Read(p []byte) (int, error) {
	now := b.now()
	if due := b.due(); !now.Before(due) {
		return 0, b.cause(now)
	}
	if !b.noConnDL {
		if err := b.rc.SetReadDeadline(b.due()); err != nil {
			b.noConnDL = true // e.g. a ResponseRecorder; the checks between reads still apply
		}
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil && isTimeout(err) {
		return n, b.cause(b.now())
	}
	return n, err
}

// done is called once the body is read, or reading it failed. After a
// complete body it lifts the read deadline: the connection's background read
// (which notices a client going away) must not time out while the request
// waits for Kafka. After a failure it puts the deadline in the past, so the
// server does not wait for the rest of the body (it drains up to 256 KiB of
// an unread body before reusing a connection): the connection closes.
func (b *bodyReader) done(complete bool) {
	if b.noConnDL {
		return
	}
	if complete {
		_ = b.rc.SetReadDeadline(time.Time{})
	} else {
		_ = b.rc.SetReadDeadline(time.Unix(1, 0))
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

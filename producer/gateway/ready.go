package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

func (g *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	if g.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: "shutting down", Code: "draining"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
	defer cancel()
	check := g.cfg.BrokerReady
	if check == nil {
		check = g.cfg.Publisher.Ping
	}
	errc := make(chan error, 1)
	go func() { errc <- check(ctx) }() // owned here: bounded by ctx
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		err = fmt.Errorf("kafka: no answer within %s", ReadyTimeout)
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: "kafka unreachable: " + err.Error(), Code: "kafka_unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// ReadyTimeout bounds GET /readyz: it answers within it whatever the
// broker does (503 naming the broker when the check has no answer by then).
const ReadyTimeout = 800 * time.Millisecond

// RetryAfterUnknown is the Retry-After, in seconds, of a 503 whose events
// Kafka did not answer within the delivery timeout: a broker that slow is
// not back in a second.
const RetryAfterUnknown = 5

// errUnknownFate is the error of an event answered unknown.
const errUnknownFate = "sent to Kafka but not acknowledged within the delivery timeout: it may be on the topic or not. " +
	"Retry it with the same event_id: a copy that reaches the pipeline is recognised by event_id (see docs/producer.md, \"fate unknown\")"

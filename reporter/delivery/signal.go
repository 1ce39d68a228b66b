package delivery

import "strconv"

// Signal is what one answer of the partner tells the in-flight limit
// (Decision.Signal, set by Classify): a normal answer, back-pressure, or an
// error that is about this post or this path rather than about load.
type Signal int

const (
	// SignalAnswer: the API answered (2xx, 401): its round trip counts.
	SignalAnswer Signal = iota
	// SignalBackPressure: 429, 503, 408 or any answer with Retry-After:
	// the partner (or its edge) asks for less. Cuts the limit.
	SignalBackPressure
	// SignalTimeout: no answer within the timeout. Cuts the limit.
	SignalTimeout
	// SignalPayload: an error in the API's own envelope about this post
	// (500 and other 5xx, 400). Counts toward the error rate only.
	SignalPayload
	// SignalEdge: a non-2xx that is not the API's own (an edge's page).
	// Counts toward the error rate only.
	SignalEdge
	// SignalConnection: the connection was refused, reset or lost, or the
	// answer came back cut. Counts toward the error rate only.
	SignalConnection

	// SignalIsolated is never the classifier's: the limiter's judgement
	// (the reporter's limiter) of a failure of a report that already failed, while
	// the partner answers the others at their usual latency — a payload's
	// problem, not load. It moves nothing.
	SignalIsolated
)

func (s Signal) String() string {
	switch s {
	case SignalAnswer:
		return "answer"
	case SignalBackPressure:
		return "back_pressure"
	case SignalTimeout:
		return "timeout"
	case SignalPayload:
		return "payload"
	case SignalEdge:
		return "edge"
	case SignalConnection:
		return "connection"
	case SignalIsolated:
		return "isolated"
	}
	return "signal(" + strconv.Itoa(int(s)) + ")"
}

package delivery

import (
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// Attempt is one post of a report and what its answer means: everything
// its Delivery record says but the report's doubt (Doubt).
type Attempt struct {
	ReportID, EventID string
	// N is 1 for the first post of the report by this reporter or run.
	N        int
	Decision Decision
	Latency  time.Duration
	TraceID  string
	// Partner is the base URL of the partner API posted to.
	Partner string
	// Replay: sent while replaying after a standby episode (the reporter).
	Replay bool
	// ReplayID and ReplayReason: an operator's re-delivery (replay/redrive).
	ReplayID, ReplayReason string
	At                     time.Time
}

// Doubt is what a report's posts leave unknown about its copies at the
// partner, carried from one post to the next (docs/design.md, "Delivering a
// report"; the causes are schemas.Doubt*). The reporter keeps it on its job
// (job.inDoubt, job.carried), replay/redrive per report of a run.
type Doubt struct {
	// InDoubt: a post of the report may have reached the partner without
	// its answer being known or recorded; every later record says so.
	InDoubt bool
	// Carried is the cause of an earlier post that left no Delivery record
	// of its own (schemas.DoubtCancelled: abandoned in flight;
	// schemas.DoubtCrash: a previous owner or run may have posted it):
	// the next record carries it, so that each such post is counted once.
	Carried string
}

// Posted applies the decision of one post to the report's doubt. A post in
// doubt (Decision.Doubt) labels the report from then on; recorded says
// whether the post gets a Delivery record of its own: if not (an abandoned
// post of the reporter), its cause is carried by the next record.
func (s *Doubt) Posted(d Decision, recorded bool) {
	if d.Doubt == "" {
		return
	}
	s.InDoubt = true
	if !recorded {
		s.Carried = d.Doubt
	}
}

// New builds the Delivery record of attempt a: the one builder of
// the reporter and of replay/redrive, so that both label doubt alike. s is
// the report's doubt after s.Posted(a.Decision, true): the record says
// InDoubt when s does, and its DoubtCause is the attempt's own cause or,
// without one, s.Carried, which it then clears. An abandoned post given a
// record of its own (a replay run that stops: no later post of the run
// will carry its cause) is not final: OutcomeRetry.
func New(a *Attempt, s *Doubt) schemas.Delivery {
	d := &a.Decision
	del := schemas.Delivery{
		V: schemas.DeliveryVersion, ReportID: a.ReportID, EventID: a.EventID, Outcome: d.Outcome, Attempt: a.N,
		HTTPStatus: d.Status, ServedBy: string(d.ServedBy), Partner: a.Partner, Message: d.Message, Fields: d.Fields,
		Reason: d.Reason, LatencyUS: a.Latency.Microseconds(), TraceID: a.TraceID, Replay: a.Replay,
		InDoubt: s.InDoubt, DoubtCause: d.Doubt, ReplayID: a.ReplayID, ReplayReason: a.ReplayReason, At: a.At.UnixMilli(),
	}
	if del.Outcome == "" && d.Action == ActAbandon {
		del.Outcome = schemas.OutcomeRetry
	}
	if del.DoubtCause == "" {
		del.DoubtCause, s.Carried = s.Carried, ""
	}
	if del.Message == "" && d.Err != nil && d.Action != ActDelivered {
		del.Message = d.Err.Error()
	}
	return del
}

package reporter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
)

// episode is one standby episode: from the first standby answer to a live probe.
type episode struct {
	start   time.Time
	span    trace.Span
	first   *job
	answers int
	probes  atomic.Int64
}

// standbyAnswer handles a 200 served by standby: the first one starts an
// episode (dispatch stops, the live prober starts); every one is held for
// replay.
func (rn *run) standbyAnswer(j *job) {
	if rn.standby == nil && j.gen == rn.gen {
		rn.startEpisode(j)
	}
	if rn.standby != nil {
		rn.standby.answers++
		rn.held = append(rn.held, j)
		return
	}
	// Sent before the last episode ended, answered by its tail: replay now.
	j.replay = true
	rn.ready.push(j)
	rn.jobsReady()
}

func (rn *run) startEpisode(j *job) {
	ep := &episode{start: rn.cfg.Now(), first: j}
	var link []trace.Link
	if sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), j.rec)); sc.IsValid() {
		link = append(link, trace.Link{SpanContext: sc})
	}
	_, ep.span = rn.met.tracer.Start(context.Background(), "standby.episode", trace.WithLinks(link...), trace.WithAttributes(
		attribute.String("playpipe.first_report_id", j.id),
		attribute.String("messaging.destination.name", j.rec.Topic),
		attribute.Int("messaging.kafka.partition", int(j.rec.Partition)),
		attribute.Int64("messaging.kafka.offset", j.rec.Offset),
	))
	rn.standby = ep
	rn.met.standbyActive.Add(context.Background(), 1)
	rn.met.standbyEpisode.Add(context.Background(), 1)
	rn.log.Warn("standby episode started: the partner API answered from standby (not forwarded); dispatch paused, offsets held, probing for live service",
		"report_id", j.id, "topic", j.rec.Topic, "partition", j.rec.Partition, "offset", j.rec.Offset, "in_flight", rn.inflight)
	rn.bg.Go(func() { rn.probe(ep) })
}

// probe asks for a new session until one is served live (that session's
// token is the client's from then on), or the run ends.
func (rn *run) probe(ep *episode) {
	t := rn.cfg.Clock.NewTimer(rn.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C():
		case <-rn.postCtx.Done():
			return
		}
		n := ep.probes.Add(1)
		meta, err := rn.api.Session(rn.postCtx)
		switch {
		case err == nil && !meta.Standby():
			rn.log.Info("standby probe: live service is back", "probes", n)
			rn.probedLocked(nil)
			return
		case err == nil:
			rn.log.Debug("standby probe: still standby", "probes", n)
		case errors.Is(err, context.Canceled):
			return
		default:
			switch partnerapi.KindOf(err) {
			case partnerapi.KindEdgeBlocked, partnerapi.KindRejected, partnerapi.KindNotFound:
				rn.probedLocked(err)
				return
			}
			rn.log.Debug("standby probe failed", "probes", n, "err", err)
		}
		t.Reset(rn.cfg.ProbeInterval)
	}
}

func (rn *run) probedLocked(err error) {
	rn.mu.Lock()
	rn.probed(err)
	rn.jobsReady()
	rn.mu.Unlock()
}

func (rn *run) probed(err error) {
	ep := rn.standby
	if ep == nil {
		return
	}
	if err != nil {
		rn.stop(fmt.Errorf("%w: standby probe: %w", ErrInvalidConfig, err), true)
		return
	}
	held := rn.held
	rn.held = nil
	slices.SortFunc(held, func(a, b *job) int {
		if a.ps != b.ps {
			return int(a.rec.Partition - b.rec.Partition)
		}
		return int(a.seq - b.seq)
	})
	for _, j := range held {
		j.replay = true
		rn.ready.push(j)
	}
	rn.jobsReady()
	rn.gen++
	dur := rn.cfg.Now().Sub(ep.start)
	rn.log.Warn("standby episode ended: live service is back with a new session; replaying the reports standby answered",
		"duration", dur.Round(time.Millisecond), "standby_answers", ep.answers, "replaying", len(held), "probes", ep.probes.Load())
	rn.endEpisode(len(held), "")
}

// endEpisode closes the episode's span and gauge.
func (rn *run) endEpisode(replayed int, note string) {
	ep := rn.standby
	ep.span.SetAttributes(
		attribute.Int("playpipe.standby.answers", ep.answers),
		attribute.Int("playpipe.standby.replayed", replayed),
		attribute.Int64("playpipe.standby.probes", ep.probes.Load()),
	)
	if note != "" {
		ep.span.SetStatus(codes.Error, note)
	}
	ep.span.End()
	rn.met.standbyActive.Add(context.Background(), -1)
	rn.standby = nil
}

package sandbox

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// RegisterMetrics publishes the server's counters on m as observable
// instruments, read at collection time (nothing is added to the request path):
//
//	playpipe.sandbox.responses{endpoint,status}  answers per endpoint and status
//	playpipe.sandbox.reports{kind}               accepted, standby, rejected, duplicate, injected
//	playpipe.sandbox.mode                        0 live, 1 standby, 2 live-bypass
//
// Call Unregister on the result when the server is no longer served.
func (s *Server) RegisterMetrics(m metric.Meter) (metric.Registration, error) {
	responses, err := m.Int64ObservableCounter("playpipe.sandbox.responses", metric.WithDescription("sandbox answers per endpoint and HTTP status"))
	if err != nil {
		return nil, fmt.Errorf("sandbox metrics: %w", err)
	}
	reports, err := m.Int64ObservableCounter("playpipe.sandbox.reports", metric.WithDescription("play reports by kind: accepted, standby, rejected, duplicate, injected (answered with an injected fault)"))
	if err != nil {
		return nil, fmt.Errorf("sandbox metrics: %w", err)
	}
	mode, err := m.Int64ObservableGauge("playpipe.sandbox.mode", metric.WithDescription("0 live, 1 standby, 2 live-bypass"))
	if err != nil {
		return nil, fmt.Errorf("sandbox metrics: %w", err)
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for ep := range s.counts.c {
			for st := range s.counts.c[ep] {
				if n := s.counts.c[ep][st].Load(); n > 0 {
					o.ObserveInt64(responses, n, metric.WithAttributes(attribute.String("endpoint", endpointNames[ep]), attribute.Int("status", st)))
				}
			}
		}
		for kind, n := range map[string]int64{"accepted": s.ledger.accepted.Load(), "standby": s.ledger.standby.Load(), "rejected": s.ledger.rejected.Load(), "duplicate": s.ledger.dups.Load(), "injected": s.ledger.injected.Load()} {
			o.ObserveInt64(reports, n, metric.WithAttributes(attribute.String("kind", kind)))
		}
		o.ObserveInt64(mode, int64(s.Mode()))
		return nil
	}, responses, reports, mode)
	if err != nil {
		return nil, fmt.Errorf("sandbox metrics: %w", err)
	}
	return reg, nil
}

// LedgerSince is Ledger restricted to entries with Seq > seq (counts and
// counters are totals), for tests that poll the ledger; documented for
// tests embedding the sandbox (docs/sandbox.md), not used by the binary.
func (s *Server) LedgerSince(seq uint64) LedgerSnapshot {
	l := s.ledger.snapshot(seq)
	l.Counters = s.counts.snapshot()
	return l
}

// LedgerCounts are the ledger's totals, without entries. Injected counts
// the play reports answered with an injected fault (Faults).
type LedgerCounts struct {
	Accepted, Standby, Rejected, Duplicates, Dropped, Injected int64
}

// Counts returns the ledger's totals from atomic counters: O(1), no copy,
// cheap enough to poll in a wait loop (Ledger copies every entry).
func (s *Server) Counts() LedgerCounts {
	return LedgerCounts{
		Accepted: s.ledger.accepted.Load(), Standby: s.ledger.standby.Load(), Rejected: s.ledger.rejected.Load(),
		Duplicates: s.ledger.dups.Load(), Dropped: s.ledger.dropped.Load(), Injected: s.ledger.injected.Load(),
	}
}

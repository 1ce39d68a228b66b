package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/reporter"
)

// registerReporterFlags binds the reporter's own flags (not Kafka's nor the
// partner API's) to c, with the reporter package's defaults.
func registerReporterFlags(fs *flag.FlagSet, c *reporter.Config) {
	fs.StringVar(&c.Group, "group", reporter.DefaultGroup, "Kafka consumer group of the reporter")
	fs.IntVar(&c.Concurrency, "concurrency", reporter.DefaultConcurrency, "reports in flight to start with: the adaptive limit grows it while the partner's latency stays flat, up to --max-concurrency")
	fs.IntVar(&c.MaxConcurrency, "max-concurrency", 0, fmt.Sprintf("cap of the adaptive in-flight limit (posts at once, keep-alive connections); 0: the larger of %d and --concurrency; --max-concurrency equal to --concurrency fixes the in-flight", reporter.DefaultMaxConcurrency))
	fs.Float64Var(&c.Rate, "rate", 0, "client-side rate limit in reports/s (0: unlimited)")
	fs.IntVar(&c.Burst, "rate-burst", 0, "burst of the rate limit (0: --concurrency)")
	fs.Var(notBool{&c.LiveBypassNotDelivered}, "live-bypass-delivered", "count a 200 served by live-bypass as delivered; --live-bypass-delivered=false replays it like a standby answer")
	fs.DurationVar(&c.BackoffInitial, "backoff-initial", reporter.DefaultBackoffInitial, "first retry delay of a transient failure (doubles per failure, with jitter)")
	fs.DurationVar(&c.BackoffMax, "backoff-max", reporter.DefaultBackoffMax, "largest retry delay of a transient failure")
	fs.DurationVar(&c.RetryAfterMax, "retry-after-max", reporter.DefaultRetryAfterMax, "longest server Retry-After honoured")
	fs.DurationVar(&c.ProbeInterval, "standby-probe-interval", reporter.DefaultProbeInterval, "pause between live probes while the API is in standby")
	fs.DurationVar(&c.CommitInterval, "commit-interval", reporter.DefaultCommitInterval, "least time between two commits of final offsets (one commit in flight at a time)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", reporter.DefaultShutdownTimeout, "how long shutdown waits for posts in flight before abandoning them")
	fs.IntVar(&c.MaxPending, "max-pending", reporter.DefaultMaxPending, "records held per partition between its commit point and the newest fetched record (fetching pauses for that partition alone beyond)")
	fs.IntVar(&c.Producers, "producers", reporter.DefaultProducers, "Kafka clients writing Delivery records and lease markers, each partition always through the same one: Apache Kafka serves one request of a connection at a time")
	fs.IntVar(&c.ParkAfterAttempts, "park-after-attempts", reporter.DefaultParkAfterAttempts, "retry budget of one report: failed attempts (while the partner answers other reports) before it is parked, together with --park-after (-1: never park)")
	fs.DurationVar(&c.ParkAfter, "park-after", reporter.DefaultParkAfter, "retry budget of one report: time failing (while the partner answers other reports) before it is parked, together with --park-after-attempts; a report that failed 3 times is parked at once when its partition holds --max-pending records behind it")
	fs.Var(durationList{&c.ParkRetries}, "park-retries", "slow schedule of parked reports: delays before each slow retry, comma-separated, the last repeated (default 1m,5m,30m,1h)")
	fs.IntVar(&c.WarnAfterAttempts, "warn-after-attempts", reporter.DefaultWarnAfterAttempts, "failed attempts after which a report is logged as stuck (once per report)")
	fs.Float64Var(&c.BudgetFloor, "retry-budget-floor", reporter.DefaultBudgetFloor, "retry budget: failed posts allowed per second whatever happens (the probes of a full outage)")
	fs.Float64Var(&c.BudgetRatio, "retry-budget-ratio", reporter.DefaultBudgetRatio, "retry budget: failed posts allowed per successful post")
	fs.IntVar(&c.MetadataMaxBytes, "offset-metadata-max-bytes", reporter.DefaultMetadataMaxBytes, "the brokers' offset.metadata.max.bytes: the largest progress the reporter stores with a commit (bounds how far past its commit point a partition leases: 15 185 offsets at 4096)")
	fs.IntVar(&c.RecentWindow, "dedupe-window", reporter.DefaultRecentWindow, "report ids with a final outcome remembered to skip duplicates (-1: off)")
}

// durationList is a comma-separated list of durations.
type durationList struct{ p *[]time.Duration }

func (l durationList) String() string {
	if l.p == nil {
		return ""
	}
	parts := make([]string, len(*l.p))
	for i, d := range *l.p {
		parts[i] = d.String()
	}
	return strings.Join(parts, ",")
}

func (l durationList) Set(s string) error {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		out = append(out, d)
	}
	*l.p = out
	return nil
}

// notBool is a boolean flag bound to the negation of *p (default true).
type notBool struct{ p *bool }

func (b notBool) String() string {
	if b.p == nil || !*b.p {
		return "true"
	}
	return "false"
}

func (b notBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("accepted: true, false")
	}
	*b.p = !v
	return nil
}

func (b notBool) IsBoolFlag() bool { return true }

package replay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
)

// Kinds of run.
const (
	KindReplay  = "replay"  // re-deliver reports the partner lost
	KindRedrive = "redrive" // re-send reports the API rejected (400)
)

// Window bases of a replay (Selection.By).
const (
	ByEvent     = "event"     // the play's time (played_at of the report)
	ByDelivered = "delivered" // the time of the original live delivery
	ByDerived   = "derived"   // the time the consumer derived the play (the reports record's timestamp)
)

// ByNames are the accepted Selection.By values.
var ByNames = []string{ByEvent, ByDelivered, ByDerived}

// Selection says which reports a run re-sends.
type Selection struct {
	Kind string // KindReplay or KindRedrive
	// From and To bound the window [From, To); zero To is now. For a
	// replay it applies to By; for a redrive to the time of the rejection
	// (zero From and To: every rejection).
	From, To time.Time
	By       string // replay: ByEvent, ByDelivered or ByDerived
	// OnlyStandby (replay): only reports answered by standby (with
	// ByDelivered: answered by standby in the window).
	OnlyStandby bool
	// Messages (redrive): only rejections with one of these API messages.
	Messages []string
	// ReportIDs (redrive, replay): only these report ids.
	ReportIDs []string
	// Parked (redrive): the reports the live reporter parked (their last
	// answer transient, no final answer since) instead of rejected ones;
	// From and To then bound the time they were parked. Tracks narrows them
	// (with or without Parked) to plays of these track ids.
	Parked bool
	Tracks []int64
}

// Validate checks the selection.
func (s Selection) Validate() error {
	switch s.Kind {
	case KindReplay:
		if !slices.Contains(ByNames, s.By) {
			return fmt.Errorf("--by %q: accepted: %s", s.By, strings.Join(ByNames, ", "))
		}
		if s.From.IsZero() {
			return errors.New("--from is required: the start of the window to replay")
		}
	case KindRedrive:
		if s.Parked && len(s.Messages) > 0 {
			return errors.New("--message selects rejections: not with --parked")
		}
		if !s.Parked && s.From.IsZero() && s.To.IsZero() && len(s.Messages) == 0 && len(s.ReportIDs) == 0 && len(s.Tracks) == 0 {
			return errors.New("select what to redrive: --message, --report-id, or a window (--from/--to) for every rejection in it")
		}
	default:
		return fmt.Errorf("replay: unknown kind %q", s.Kind)
	}
	if !s.To.IsZero() && !s.From.Before(s.To) {
		return fmt.Errorf("--from (%s) must be before --to (%s)", s.From.Format(time.RFC3339), s.To.Format(time.RFC3339))
	}
	for _, id := range s.ReportIDs {
		if !reportIDRE.MatchString(id) {
			return fmt.Errorf("--report-id %q: a report id is 32 lower-case hex digits", id)
		}
	}
	return nil
}

// Config configures a run.
type Config struct {
	Kafka    kafkax.Config
	CH       driver.Conn // the ledger
	Database string
	// ReplayID names the run; empty: a new one (NewID). Re-running an id
	// sends nothing that id already delivered.
	ReplayID string
	Reason   string // required: recorded with every delivery
	// Partner is the base URL of the partner API, recorded in the deliveries.
	Partner string
	DryRun  bool
	// Rate bounds the posts per second (0: no bound); Concurrency the posts
	// in flight (default 8).
	Rate        float64
	Concurrency int
	// MaxAttempts bounds the posts of one report answered by a transient
	// failure or by standby (default 8); such a report is then left for a
	// re-run and the run ends with an error naming how many.
	MaxAttempts int
	// BackoffInitial/BackoffMax bound the delay between attempts (100 ms, 5 s).
	BackoffInitial, BackoffMax time.Duration
	// Progress is the interval of progress lines on Out (default 5 s; 0 with
	// Out nil: none).
	Progress time.Duration
	Out      io.Writer
	// Samples is how many report ids a dry run prints (0: 10; < 0: none).
	Samples int
	// LiveBypassDelivered as the reporter's flag (default true at the command).
	LiveBypassDelivered bool
	// OwnerWait (redrive --parked) bounds the wait for the reporter that
	// owns each parked report to serve the run's request (default
	// DefaultOwnerWait); requests not served by then stay queued.
	OwnerWait time.Duration
	// KafkaTimeout bounds every wait on Kafka (default
	// DefaultKafkaTimeout): an admin request, a Delivery record's
	// acknowledgement, a read that gets nothing while the broker does not
	// answer either. Past it the run ends with a *KafkaTimeoutError; a
	// re-run of its id resumes.
	KafkaTimeout time.Duration
	Logger       *slog.Logger
}

var (
	identRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	replayIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$`)
	reportIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// NewID returns a new replay id: rp-<UTC time>-<8 hex>.
func NewID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "rp-" + now.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

func (c *Config) check() error {
	if strings.TrimSpace(c.Reason) == "" {
		return errors.New("--reason is required: say why the reports are sent again (it is recorded with every delivery)")
	}
	if c.ReplayID != "" && !replayIDRE.MatchString(c.ReplayID) {
		return fmt.Errorf("--replay-id %q: 1–100 characters of letters, digits and . _ : - (starting with a letter or digit)", c.ReplayID)
	}
	if c.Rate < 0 {
		return fmt.Errorf("--rate must be ≥ 0 (0: no limit), got %v", c.Rate)
	}
	if c.Concurrency < 0 || c.Concurrency > 1024 {
		return fmt.Errorf("--concurrency must be between 1 and 1024, got %d", c.Concurrency)
	}
	if c.KafkaTimeout < 0 {
		return fmt.Errorf("--kafka-timeout must be > 0, got %v", c.KafkaTimeout)
	}
	if c.KafkaTimeout == 0 {
		c.KafkaTimeout = DefaultKafkaTimeout
	}
	if c.Progress < 0 {
		return fmt.Errorf("--progress must be ≥ 0 (0: no progress lines), got %v", c.Progress)
	}
	if !identRE.MatchString(c.Database) {
		return fmt.Errorf("replay: database %q is not an identifier", c.Database)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.OwnerWait <= 0 {
		c.OwnerWait = DefaultOwnerWait
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 8
	}
	if c.BackoffInitial <= 0 {
		c.BackoffInitial = 100 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.Samples == 0 {
		c.Samples = 10
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Result sums up a run.
type Result struct {
	ReplayID string `json:"replay_id"`
	// Selected: report ids the ledger selects; AlreadyDone: of which this
	// replay id already has a final answer for (skipped).
	Selected    int `json:"selected"`
	AlreadyDone int `json:"already_done"`
	// Missing: selected reports whose record was not found in <prefix>.reports
	// (retention) by a run that read its whole range; nothing is sent for
	// them.
	Missing   int `json:"missing"`
	Posts     int `json:"posts"`
	Delivered int `json:"delivered"`
	Rejected  int `json:"rejected"`
	// Unfinished: reports without a final answer after MaxAttempts (redrive
	// --parked: posted by their owner without a final answer, still
	// parked).
	Unfinished int `json:"unfinished"`
	// Untried: selected reports the run stopped before (interrupted); a
	// re-run of the id sends them.
	Untried int `json:"untried"`
	// Queued (redrive --parked): requests their owner had not answered when
	// the run stopped waiting; each is still served once.
	Queued  int      `json:"queued"`
	Samples []string `json:"sample_report_ids,omitempty"`
	DryRun  bool     `json:"dry_run,omitempty"`
}

// item is one selected report and where its record is.
type item struct {
	reportID, eventID string
	partition         int32
	offset            int64
	timeMS            int64
	// inDoubt: a live post of the report may have reached the partner
	// without a recorded answer (a parked report whose posts were in
	// doubt): every record the run writes for it says in_doubt, as the
	// reporter's slow lane would.
	inDoubt bool
}

// Run runs a replay or redrive: see the package documentation. It returns
// the result so far with any error.
func Run(ctx context.Context, cfg Config, api *partnerapi.Client, sel Selection) (Result, error) {
	res, err := run(ctx, &cfg, api, sel)
	if ke := (*KafkaTimeoutError)(nil); errors.As(err, &ke) && cfg.ReplayID != "" {
		err = fmt.Errorf("%w; nothing is lost: run again with --replay-id %s to resume (a report posted without a recorded answer is posted again, labelled in doubt)", err, cfg.ReplayID)
	}
	return res, err
}

// run is Run with cfg's defaults filled in (cfg.ReplayID is the run's id).
func run(ctx context.Context, cfg *Config, api *partnerapi.Client, sel Selection) (Result, error) {
	if err := prepare(cfg, &sel); err != nil {
		return Result{}, err
	}
	res := Result{ReplayID: cfg.ReplayID, DryRun: cfg.DryRun}
	log := cfg.Logger.With("replay_id", cfg.ReplayID, "kind", sel.Kind)
	topics := cfg.Kafka.Topics()

	items, err := selectReports(ctx, *cfg, sel)
	if err != nil {
		return res, err
	}
	res.Selected = len(items)

	opts, err := cfg.Kafka.ClientOpts()
	if err != nil {
		return res, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return res, fmt.Errorf("replay: kafka client: %w", err)
	}
	// Bounded: a Delivery record a frozen broker holds must not hold the
	// process's exit (kgo's Close waits for requests in flight).
	defer kafkax.CloseClient(cl, 0)
	adm := kadm.NewClient(cl)
	group := "playpipe-replay." + cfg.ReplayID
	w := waits{timeout: cfg.KafkaTimeout, brokers: cfg.Kafka.Brokers}

	// A re-run: what this id already sent, from the deliveries log.
	var pr prior
	err = w.do(ctx, "reading the progress of group "+group, func(ctx context.Context) (err error) {
		pr, err = runStart(ctx, adm, group, topics.Reports)
		return err
	})
	if err != nil {
		return res, err
	}
	if pr.found {
		if items, err = skipDone(ctx, w, opts, adm, topics.Deliveries, cfg.ReplayID, pr.startMS, items, &res); err != nil {
			return res, err
		}
	}
	for i := 0; i < len(items) && i < cfg.Samples; i++ {
		res.Samples = append(res.Samples, items[i].reportID)
	}
	if cfg.DryRun {
		return res, nil
	}
	if len(items) == 0 {
		log.Info("nothing to send", "selected", res.Selected, "already_done", res.AlreadyDone)
		return res, nil
	}
	if sel.Parked {
		// Asked of the reports' owner, never posted here (parked.go).
		return res, redriveParked(ctx, cfg, w, opts, adm, items, &res)
	}
	r := &runner{cfg: *cfg, w: w, api: api, log: log, topic: topics.Deliveries, cl: cl, kind: sel.Kind,
		// A report re-posted after a crash of a previous run of this id (it
		// selected the report, but no final answer is on record) may have
		// reached the partner: label it in doubt. After runs that all
		// stopped gracefully every post is on record (a post cancelled in
		// flight has a record with its cause): nothing to label.
		inDoubt: pr.crashed}
	if cfg.Rate > 0 {
		r.lim = rate.NewLimiter(rate.Limit(cfg.Rate), max(1, int(cfg.Rate/10)))
	}
	err = r.send(ctx, opts, adm, group, topics.Reports, items, pr, &res)
	return res, err
}

// prepare checks cfg and sel and fills in their defaults: the end of an
// open window (now) and a new replay id when none is given.
func prepare(cfg *Config, sel *Selection) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if err := sel.Validate(); err != nil {
		return err
	}
	if sel.To.IsZero() && !sel.From.IsZero() {
		sel.To = time.Now()
	}
	if cfg.ReplayID == "" {
		cfg.ReplayID = NewID(time.Now())
	}
	return nil
}

// skipDone drops from items the reports a previous run of replayID already
// got a final answer for (read from the deliveries topic since startMS),
// counting them in res.AlreadyDone.
func skipDone(ctx context.Context, w waits, opts []kgo.Opt, adm *kadm.Client, deliveries, replayID string, startMS int64, items []item, res *Result) ([]item, error) {
	done, err := alreadyDone(ctx, w, opts, adm, deliveries, replayID, startMS)
	if err != nil {
		return items, err
	}
	kept := items[:0]
	for _, it := range items {
		if done[it.reportID] {
			res.AlreadyDone++
			continue
		}
		kept = append(kept, it)
	}
	return kept, nil
}

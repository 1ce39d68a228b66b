package replay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/schemas"
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
}

// Validate checks the selection.
func (s Selection) Validate() error {
	switch s.Kind {
	case KindReplay:
		if !contains(ByNames, s.By) {
			return fmt.Errorf("--by %q: accepted: %s", s.By, strings.Join(ByNames, ", "))
		}
		if s.From.IsZero() {
			return errors.New("--from is required: the start of the window to replay")
		}
	case KindRedrive:
		if s.From.IsZero() && s.To.IsZero() && len(s.Messages) == 0 && len(s.ReportIDs) == 0 {
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
	Logger              *slog.Logger
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
	if c.Progress < 0 {
		return fmt.Errorf("--progress must be ≥ 0 (0: no progress lines), got %v", c.Progress)
	}
	if !identRE.MatchString(c.Database) {
		return fmt.Errorf("replay: database %q is not an identifier", c.Database)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
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
	// (retention); nothing is sent for them.
	Missing   int `json:"missing"`
	Posts     int `json:"posts"`
	Delivered int `json:"delivered"`
	Rejected  int `json:"rejected"`
	// Unfinished: reports without a final answer after MaxAttempts.
	Unfinished int      `json:"unfinished"`
	Samples    []string `json:"sample_report_ids,omitempty"`
	DryRun     bool     `json:"dry_run,omitempty"`
}

// item is one selected report and where its record is.
type item struct {
	reportID, eventID string
	partition         int32
	offset            int64
	timeMS            int64
}

// Run runs a replay or redrive: see the package documentation. It returns
// the result so far with any error.
func Run(ctx context.Context, cfg Config, api *partnerapi.Client, sel Selection) (Result, error) {
	if err := cfg.check(); err != nil {
		return Result{}, err
	}
	if err := sel.Validate(); err != nil {
		return Result{}, err
	}
	if sel.To.IsZero() && !sel.From.IsZero() {
		sel.To = time.Now()
	}
	resumed := cfg.ReplayID != ""
	if !resumed {
		cfg.ReplayID = NewID(time.Now())
	}
	res := Result{ReplayID: cfg.ReplayID, DryRun: cfg.DryRun}
	log := cfg.Logger.With("replay_id", cfg.ReplayID, "kind", sel.Kind)
	topics := cfg.Kafka.Topics()

	items, err := selectReports(ctx, cfg, sel)
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
	defer cl.Close()
	adm := kadm.NewClient(cl)
	group := "playpipe-replay." + cfg.ReplayID

	// A re-run: what this id already sent, from the deliveries log.
	startMS, found, err := runStart(ctx, adm, group, topics.Reports)
	if err != nil {
		return res, err
	}
	if found {
		done, err := alreadyDone(ctx, opts, adm, topics.Deliveries, cfg.ReplayID, startMS)
		if err != nil {
			return res, err
		}
		kept := items[:0]
		for _, it := range items {
			if done[it.reportID] {
				res.AlreadyDone++
				continue
			}
			kept = append(kept, it)
		}
		items = kept
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
	ranges, err := offsetRanges(ctx, adm, topics.Reports, items)
	if err != nil {
		return res, err
	}
	if !found {
		startMS = time.Now().UnixMilli()
	}
	if err := commitRanges(ctx, adm, group, topics.Reports, ranges, startMS, false); err != nil {
		return res, err
	}
	log.Info("replay started", "reason", cfg.Reason, "reports", len(items), "resumed", found)

	r := &runner{cfg: cfg, api: api, log: log, topic: topics.Deliveries, cl: cl, kind: sel.Kind}
	if cfg.Rate > 0 {
		r.lim = rate.NewLimiter(rate.Limit(cfg.Rate), max(1, int(cfg.Rate/10)))
	}
	// A report re-posted after a crash of a previous run of this id (it
	// selected the report, but no final answer is on record) may have
	// reached the partner: label it in doubt.
	r.inDoubt = found
	err = r.run(ctx, opts, topics.Reports, ranges, items, &res)
	if err == nil {
		if cerr := commitRanges(ctx, adm, group, topics.Reports, ranges, startMS, true); cerr != nil {
			log.Warn("recording the end of the replay", "err", cerr)
		}
	}
	return res, err
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// quote is a ClickHouse string literal of s.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func quoteList(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = quote(s)
	}
	return "(" + strings.Join(q, ", ") + ")"
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// selectReports reads the selected report ids and their records' locations
// from the ledger. A replay selects only reports the live reporter
// delivered (the others are still its job); a redrive only reports
// rejected with 400 and delivered by nobody. Reports this replay id already
// has a final answer for in the ledger are left out (see alreadyDone for
// the ones not in the ledger yet).
func selectReports(ctx context.Context, cfg Config, sel Selection) ([]item, error) {
	db := cfg.Database
	win := func(col string) string {
		var c []string
		if !sel.From.IsZero() {
			c = append(c, col+" >= "+ms(sel.From))
		}
		if !sel.To.IsZero() {
			c = append(c, col+" < "+ms(sel.To))
		}
		if len(c) == 0 {
			return "1"
		}
		return strings.Join(c, " AND ")
	}
	const standby = "(outcome = 'standby' OR served_by = 'standby')"
	var conds []string
	switch sel.Kind {
	case KindReplay:
		conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE outcome = 'delivered' AND replay_id = '')")
		switch sel.By {
		case ByEvent:
			conds = append(conds, win("played_at_ms"))
		case ByDerived:
			conds = append(conds, win("kafka_time_ms"))
		case ByDelivered:
			c := "outcome = 'delivered' AND replay_id = ''"
			if sel.OnlyStandby {
				c = standby
			}
			conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE "+c+" AND "+win("at_ms")+")")
		}
		if sel.OnlyStandby && sel.By != ByDelivered {
			conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE "+standby+")")
		}
	case KindRedrive:
		c := "outcome = 'rejected' AND http_status = 400 AND " + win("at_ms")
		if len(sel.Messages) > 0 {
			c += " AND message IN " + quoteList(sel.Messages)
		}
		conds = append(conds, "report_id IN (SELECT report_id FROM "+db+".deliveries WHERE "+c+")",
			"report_id NOT IN (SELECT report_id FROM "+db+".deliveries WHERE outcome = 'delivered')")
	}
	if len(sel.ReportIDs) > 0 {
		conds = append(conds, "report_id IN "+quoteList(sel.ReportIDs))
	}
	conds = append(conds, "kafka_topic = "+quote(cfg.Kafka.Topics().Reports),
		"report_id NOT IN (SELECT report_id FROM "+db+".deliveries WHERE replay_id = "+quote(cfg.ReplayID)+" AND outcome IN ('delivered', 'rejected'))")
	q := `SELECT report_id, any(event_id), argMin(kafka_partition, kafka_offset), min(kafka_offset), toInt64(min(kafka_time_ms))
FROM ` + db + `.plays WHERE ` + strings.Join(conds, " AND ") + `
GROUP BY report_id HAVING max(below_minimum) = 0 ORDER BY report_id`
	rows, err := cfg.CH.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("replay: select the reports in the ledger: %w", err)
	}
	defer rows.Close()
	var out []item
	for rows.Next() {
		var it item
		if err := rows.Scan(&it.reportID, &it.eventID, &it.partition, &it.offset, &it.timeMS); err != nil {
			return nil, fmt.Errorf("replay: select the reports in the ledger: %w", err)
		}
		out = append(out, it)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replay: select the reports in the ledger: %w", err)
	}
	return out, nil
}

// metaPrefix starts the offset-commit metadata of a run's group:
// "pp-replay1:<start ms>:<running|done>".
const metaPrefix = "pp-replay1:"

// runStart returns the start time a previous run of this id recorded.
func runStart(ctx context.Context, adm *kadm.Client, group, topic string) (int64, bool, error) {
	resp, err := adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return 0, false, nil // a first run
	}
	if err != nil {
		return 0, false, fmt.Errorf("replay: read the progress of %s: %w", group, err)
	}
	var start int64
	found := false
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err != nil || o.Topic != topic || !strings.HasPrefix(o.Metadata, metaPrefix) {
			return
		}
		f := strings.SplitN(strings.TrimPrefix(o.Metadata, metaPrefix), ":", 2)
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return
		}
		if !found || v < start {
			start, found = v, true
		}
	})
	return start, found, nil
}

// commitRanges records the run in its own group: each partition's range
// start (end when done), with the run's start time in the metadata.
func commitRanges(ctx context.Context, adm *kadm.Client, group, topic string, ranges map[int32][2]int64, startMS int64, done bool) error {
	state := "running"
	if done {
		state = "done"
	}
	var os kadm.Offsets
	for p, rg := range ranges {
		at := rg[0]
		if done {
			at = rg[1]
		}
		os.Add(kadm.Offset{Topic: topic, Partition: p, At: at, LeaderEpoch: -1,
			Metadata: metaPrefix + strconv.FormatInt(startMS, 10) + ":" + state})
	}
	resp, err := adm.CommitOffsets(ctx, group, os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("replay: record the run in group %s: %w", group, err)
	}
	return nil
}

// offsetRanges returns, per partition of the reports topic, the offsets
// [start, end) holding the selected records: ListOffsets by the records'
// timestamps, widened to the ledger's offsets.
func offsetRanges(ctx context.Context, adm *kadm.Client, topic string, items []item) (map[int32][2]int64, error) {
	minT, maxT := items[0].timeMS, items[0].timeMS
	type span struct{ lo, hi int64 }
	parts := map[int32]*span{}
	for _, it := range items {
		minT, maxT = min(minT, it.timeMS), max(maxT, it.timeMS)
		s := parts[it.partition]
		if s == nil {
			parts[it.partition] = &span{it.offset, it.offset}
			continue
		}
		s.lo, s.hi = min(s.lo, it.offset), max(s.hi, it.offset)
	}
	lo, err := adm.ListOffsetsAfterMilli(ctx, minT, topic)
	if err == nil {
		err = lo.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list offsets of %s at %d: %w", topic, minT, err)
	}
	hi, err := adm.ListOffsetsAfterMilli(ctx, maxT+1, topic)
	if err == nil {
		err = hi.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list offsets of %s at %d: %w", topic, maxT+1, err)
	}
	out := map[int32][2]int64{}
	for p, s := range parts {
		start, end := s.lo, s.hi+1
		if o, ok := lo.Lookup(topic, p); ok && o.Offset >= 0 {
			start = min(start, o.Offset)
		}
		if o, ok := hi.Lookup(topic, p); ok && o.Offset >= 0 {
			end = max(end, o.Offset)
		}
		out[p] = [2]int64{start, end}
	}
	return out, nil
}

// readRanges reads the records of topic in ranges (read_committed) and
// calls fn for each, until every partition reached its end or no record
// came for idle (the offsets left hold none: transaction markers, aborted).
func readRanges(ctx context.Context, opts []kgo.Opt, topic string, ranges map[int32][2]int64, fn func(*kgo.Record) error) error {
	if len(ranges) == 0 {
		return nil
	}
	parts := map[int32]kgo.Offset{}
	next := map[int32]int64{}
	for p, rg := range ranges {
		if rg[1] <= rg[0] {
			continue
		}
		parts[p] = kgo.NewOffset().At(rg[0])
		next[p] = rg[0]
	}
	if len(parts) == 0 {
		return nil
	}
	opts = append(append([]kgo.Opt(nil), opts...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("replay: read %s: %w", topic, err)
	}
	defer cl.Close()
	const idle = 3 * time.Second
	last := time.Now()
	for len(next) > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && ferr == nil {
				ferr = fmt.Errorf("replay: read %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		got := false
		var rerr error
		fs.EachRecord(func(r *kgo.Record) {
			n, ok := next[r.Partition]
			if !ok || rerr != nil {
				return
			}
			got = true
			if r.Offset >= ranges[r.Partition][1] {
				delete(next, r.Partition)
				return
			}
			if r.Offset >= n {
				rerr = fn(r)
				next[r.Partition] = r.Offset + 1
				if r.Offset+1 >= ranges[r.Partition][1] {
					delete(next, r.Partition)
				}
			}
		})
		if rerr != nil {
			return rerr
		}
		if got {
			last = time.Now()
		} else if time.Since(last) > idle {
			return nil
		}
	}
	return nil
}

// alreadyDone returns the report ids replayID already got a final answer
// for, read from the deliveries log since the run's start.
func alreadyDone(ctx context.Context, opts []kgo.Opt, adm *kadm.Client, topic, replayID string, startMS int64) (map[string]bool, error) {
	from, err := adm.ListOffsetsAfterMilli(ctx, startMS, topic)
	if err == nil {
		err = from.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list offsets of %s: %w", topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list end offsets of %s: %w", topic, err)
	}
	ranges := map[int32][2]int64{}
	from.Each(func(o kadm.ListedOffset) {
		if e, ok := ends.Lookup(topic, o.Partition); ok && o.Offset >= 0 && o.Offset < e.Offset {
			ranges[o.Partition] = [2]int64{o.Offset, e.Offset}
		}
	})
	done := map[string]bool{}
	err = readRanges(ctx, opts, topic, ranges, func(r *kgo.Record) error {
		if kafkax.HasHeader(r, schemas.HeaderLease) {
			return nil
		}
		var d schemas.Delivery
		if schemas.DecodeDelivery(r.Value, &d) != nil || d.ReplayID != replayID {
			return nil
		}
		if d.Outcome == schemas.OutcomeDelivered || d.Outcome == schemas.OutcomeRejected {
			done[d.ReportID] = true
		}
		return nil
	})
	return done, err
}

// runner posts the selected reports.
type runner struct {
	cfg     Config
	api     *partnerapi.Client
	log     *slog.Logger
	cl      *kgo.Client
	topic   string
	kind    string
	lim     *rate.Limiter
	inDoubt bool

	posts, delivered, rejected, unfinished, found atomic.Int64
}

type job struct {
	it   item
	body []byte
}

func (r *runner) run(ctx context.Context, opts []kgo.Opt, reports string, ranges map[int32][2]int64, items []item, res *Result) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	want := make(map[int32]map[int64]item, len(ranges))
	for _, it := range items {
		if want[it.partition] == nil {
			want[it.partition] = map[int64]item{}
		}
		want[it.partition][it.offset] = it
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := r.deliver(ctx, j); err != nil {
					cancel(err)
				}
			}
		}()
	}
	progressDone := make(chan struct{})
	var pwg sync.WaitGroup
	if r.cfg.Progress > 0 {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			t := time.NewTicker(r.cfg.Progress)
			defer t.Stop()
			for {
				select {
				case <-progressDone:
					return
				case <-t.C:
					r.progress(len(items))
				}
			}
		}()
	}
	readErr := readRanges(ctx, opts, reports, ranges, func(rec *kgo.Record) error {
		it, ok := want[rec.Partition][rec.Offset]
		if !ok {
			return nil
		}
		var tp schemas.TrackPlayHead
		if err := schemas.DecodeTrackPlayHead(rec.Value, &tp); err != nil || tp.ReportID != it.reportID || len(tp.Report) == 0 {
			return fmt.Errorf("replay: %s/%d@%d is not the track play %s the ledger names (%v)", reports, rec.Partition, rec.Offset, it.reportID, err)
		}
		delete(want[rec.Partition], rec.Offset)
		r.found.Add(1)
		select {
		case jobs <- job{it: it, body: tp.Report}:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	close(jobs)
	wg.Wait()
	close(progressDone)
	pwg.Wait()
	r.progress(len(items))
	for _, m := range want {
		res.Missing += len(m)
	}
	res.Posts, res.Delivered, res.Rejected, res.Unfinished = int(r.posts.Load()), int(r.delivered.Load()), int(r.rejected.Load()), int(r.unfinished.Load())
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if readErr != nil {
		return readErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var problems []string
	if res.Missing > 0 {
		var ids []string
		for _, m := range want {
			for _, it := range m {
				ids = append(ids, it.reportID)
			}
		}
		sort.Strings(ids)
		problems = append(problems, fmt.Sprintf("%d selected reports not found in %s (retention?), e.g. %s", res.Missing, reports, ids[0]))
	}
	if res.Unfinished > 0 {
		problems = append(problems, fmt.Sprintf("%d reports without a final answer after %d attempts: run again with --replay-id %s", res.Unfinished, r.cfg.MaxAttempts, r.cfg.ReplayID))
	}
	if len(problems) > 0 {
		return errors.New("replay: " + strings.Join(problems, "; "))
	}
	return nil
}

func (r *runner) progress(total int) {
	fmt.Fprintf(r.cfg.Out, "%s %s: %d/%d found, %d posts, %d delivered, %d rejected, %d unfinished\n",
		r.kind, r.cfg.ReplayID, r.found.Load(), total, r.posts.Load(), r.delivered.Load(), r.rejected.Load(), r.unfinished.Load())
}

// deliver posts one report until a final answer or MaxAttempts, publishing
// every answer. It returns an error only when the whole run must stop.
func (r *runner) deliver(ctx context.Context, j job) error {
	backoff := r.cfg.BackoffInitial
	for attempt := 1; ; attempt++ {
		if r.lim != nil {
			if err := r.lim.Wait(ctx); err != nil {
				return nil // stopping
			}
		}
		r.posts.Add(1)
		res, err := r.api.ReportPlayJSON(ctx, j.body)
		dec := reporter.Classify(res, err, r.cfg.LiveBypassDelivered)
		if dec.Action == reporter.ActAbandon || ctx.Err() != nil {
			return nil
		}
		d := schemas.Delivery{V: schemas.DeliveryVersion, ReportID: j.it.reportID, EventID: j.it.eventID, Outcome: dec.Outcome,
			Attempt: attempt, HTTPStatus: dec.Status, ServedBy: string(dec.ServedBy), Partner: r.cfg.Partner, Message: dec.Message,
			Fields: dec.Fields, Reason: dec.Reason, LatencyUS: res.Latency.Microseconds(), InDoubt: r.inDoubt && attempt == 1,
			ReplayID: r.cfg.ReplayID, ReplayReason: r.cfg.Reason, At: time.Now().UnixMilli()}
		if d.Message == "" && dec.Err != nil && dec.Action != reporter.ActDelivered {
			d.Message = dec.Err.Error()
		}
		if dec.Action != reporter.ActStop {
			val, merr := json.Marshal(d)
			if merr != nil {
				return fmt.Errorf("replay: encode delivery: %w", merr)
			}
			if perr := r.cl.ProduceSync(ctx, &kgo.Record{Topic: r.topic, Key: []byte(d.ReportID), Value: val}).FirstErr(); perr != nil {
				return fmt.Errorf("replay: publish the answer for %s to %s: %w", d.ReportID, r.topic, perr)
			}
		}
		switch dec.Action {
		case reporter.ActDelivered:
			r.delivered.Add(1)
			return nil
		case reporter.ActRejected:
			r.rejected.Add(1)
			r.log.Warn("report rejected", "report_id", d.ReportID, "message", d.Message)
			return nil
		case reporter.ActStop:
			return fmt.Errorf("replay: the partner API refuses us (configuration): %w", dec.Err)
		}
		if attempt >= r.cfg.MaxAttempts {
			r.unfinished.Add(1)
			r.log.Warn("no final answer", "report_id", d.ReportID, "attempts", attempt, "last", d.Outcome, "reason", d.Reason)
			return nil
		}
		wait := max(backoff, dec.RetryAfter)
		backoff = min(2*backoff, r.cfg.BackoffMax)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

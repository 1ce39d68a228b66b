//go:build unix

package edge

import (
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestSlowPartnerCopies: the audit counts copies. The partner records every report
// but answers its first two posts after 3 s, past the reporter's 1 s
// --api-timeout. Each play then reaches the partner three times; the
// reporter labels the two timed-out posts in doubt (cause timeout), and the
// audit's bound on extra copies is at least the partner's duplicates —
// counting copies, not plays.
func TestSlowPartnerCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Seed = 5; c.Pages, c.ListsPerPage, c.MixesPerList = 1, 1, 3 })
	sp := &testenv.LatePartner{H: sb.Handler(), Slow: 2, Delay: 3 * time.Second}
	url := testenv.ServeHandler(t, sp)
	r := runPipeline(t, pipelineRun{sb: sb, apiURL: url, requestTimeout: time.Second, events: 3, rate: 50})
	slowN := sp.Late()
	t.Logf("slow partner: %d plays delivered, %d posts answered late, partner duplicates %d, plays labelled in doubt %d, audit possible extra copies %d (%d plays), doubtful posts by cause %v; problems %q",
		r.plays, slowN, r.duplicates, r.inDoubtPlays, r.audit.PossibleExtraCopies, r.audit.PlaysWithExtraCopies, r.audit.DoubtfulPostsByCause, r.audit.Problems())
	if r.duplicates < int64(r.plays) {
		t.Errorf("the partner holds %d duplicates of %d plays: the slow answers did not make the reporter post again", r.duplicates, r.plays)
	}
	if !r.hasCause(schemas.DoubtTimeout) {
		t.Errorf("no post labelled with cause timeout: %v", r.audit.DoubtfulPostsByCause)
	}
}

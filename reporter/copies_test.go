package reporter

import "github.com/playpipe/playpipe/schemas"

// checkCopies checks the audit's promise on the Delivery records of an
// end-to-end run: for every report, the copies the partner holds beyond one
// are at most its `delivered` records plus its records with a doubt cause,
// minus one. It returns the records per cause.
func (e *e2e) checkCopies() map[string]int {
	e.t.Helper()
	counts := e.ledgerCounts()
	delivered, doubtful, causes := map[string]int{}, map[string]int{}, map[string]int{}
	for _, d := range e.deliveries() {
		if d.Outcome == schemas.OutcomeDelivered {
			delivered[d.ReportID]++
		}
		if d.DoubtCause != "" {
			doubtful[d.ReportID]++
			causes[d.DoubtCause]++
		}
	}
	for id, n := range counts {
		if bound := delivered[id] + doubtful[id] - 1; n-1 > bound {
			e.t.Errorf("report %s: the partner holds %d copies, the records bound the extras at %d (%d delivered, %d with a doubt cause)", id, n, bound, delivered[id], doubtful[id])
		}
	}
	return causes
}

package sandbox

import (
	"math"
	"testing"
)

// TestRateDrawShares: over many seeded draws each rate's share is within 5
// standard deviations of Binomial(n, rate), for several seeds.
func TestRateDrawShares(t *testing.T) {
	const n = 200_000
	rates := map[int]float64{500: 0.01, 503: 0.02, 429: 0.001}
	for _, seed := range []uint64{0, 1, 7, 1 << 40} {
		st := newFaultState(Faults{Seed: seed, Report: GroupFaults{Rate500: rates[500], Rate503: rates[503], Rate429: rates[429]}})
		got := map[int]int{}
		for range n {
			s, _ := st.draw(GroupReport, "")
			got[s]++
		}
		for status, p := range rates {
			if d := math.Abs(float64(got[status]) - n*p); d > 5*math.Sqrt(n*p*(1-p)) {
				t.Errorf("seed %d: %d answered %d times over %d draws, want %.0f ± %.0f", seed, status, got[status], n, n*p, 5*math.Sqrt(n*p*(1-p)))
			}
		}
	}
}

// TestReportTrackID: the track id is read from valid bodies only.
func TestReportTrackID(t *testing.T) {
	for body, want := range map[string]int64{
		`{"trackid":42}`:                  42,
		`{"a":{"trackid":1},"trackid":7}`: 7,
		`{"trackid":1,"trackid":9}`:       9,
		`{"trackid":"42"}`:                -1,
		`{"trackid":42`:                   -1,
		`[1]`:                             -1,
		`{"trackid":4.0}`:                 -1,
	} {
		id, ok := reportTrackID([]byte(body))
		if !ok {
			id = -1
		}
		if id != want {
			t.Errorf("%s: %d, want %d", body, id, want)
		}
	}
}

//go:build linux

package main

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

// The schedule is a function of the seed: the same seed gives the same
// faults, another seed others; kinds of one group never overlap; every
// fault ends by the total; excluded kinds never appear.
func TestPlanIsSeededAndKeepsGroupsApart(t *testing.T) {
	total := 10 * time.Minute
	a := Plan(42, total, 8*time.Second, Enabled(nil))
	b := Plan(42, total, 8*time.Second, Enabled(nil))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if c := Plan(43, total, 8*time.Second, Enabled(nil)); reflect.DeepEqual(a, c) {
		t.Fatal("seeds 42 and 43 gave the same schedule")
	}
	if len(a) < 20 {
		t.Fatalf("%d faults in 10 minutes, want at least 20", len(a))
	}
	seen := map[Kind]bool{}
	overlaps := 0
	for i, f := range a {
		seen[f.Kind] = true
		if f.At+f.For > total {
			t.Errorf("fault %d (%s) ends at %s, after the total %s", f.ID, f.Kind, f.At+f.For, total)
		}
		for _, g := range a[i+1:] {
			if g.At < f.At+f.For {
				overlaps++
				if kinds[g.Kind].group == kinds[f.Kind].group && kinds[f.Kind].group != "role" {
					t.Errorf("faults %d (%s) and %d (%s) of group %s overlap", f.ID, f.Kind, g.ID, g.Kind, kinds[f.Kind].group)
				}
			}
		}
	}
	if len(seen) < 6 || overlaps < 3 {
		t.Errorf("%d kinds, %d overlaps; want at least 6 kinds and several overlaps", len(seen), overlaps)
	}
	ex, err := ParseKinds("hang, partition")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range Plan(42, total, 8*time.Second, Enabled(ex)) {
		if slices.Contains(ex, f.Kind) {
			t.Errorf("excluded kind %s planned", f.Kind)
		}
	}
	if _, err := ParseKinds("hang,nosuch"); err == nil {
		t.Error("an unknown kind was accepted")
	}
}

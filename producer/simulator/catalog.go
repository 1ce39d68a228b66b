package simulator

import (
	"context"
	"errors"
	"fmt"

	"github.com/playpipe/playpipe/partnerapi"
)

// CatalogAPI is the part of the partner API client the catalog walk uses
// (*partnerapi.Client implements it).
type CatalogAPI interface {
	Catalog(ctx context.Context) ([]partnerapi.CatalogEntry, partnerapi.Meta, error)
	Page(ctx context.Context, id int64) (partnerapi.Page, partnerapi.Meta, error)
	List(ctx context.Context, id int64) (partnerapi.List, partnerapi.Meta, error)
	Mix(ctx context.Context, id int64) (partnerapi.Mix, partnerapi.Meta, error)
}

// CatalogFromAPI walks the partner API's catalog → pages → lists → mixes and
// returns each mix once, in discovery order, with its length and track
// starts. A page or list without content (400) and a mix not found (404) are
// skipped; any other error ends the walk. maxMixes > 0 stops after that many.
func CatalogFromAPI(ctx context.Context, api CatalogAPI, maxMixes int) ([]MixInfo, error) {
	entries, _, err := api.Catalog(ctx)
	if err != nil {
		return nil, fmt.Errorf("simulator: catalog walk: %w", err)
	}
	seen := map[int64]bool{}
	var out []MixInfo
	for _, e := range entries {
		page, _, err := api.Page(ctx, e.PageID)
		if errors.Is(err, partnerapi.ErrRejected) {
			continue // "no results for given type": a page without content
		}
		if err != nil {
			return nil, fmt.Errorf("simulator: catalog walk: page %d: %w", e.PageID, err)
		}
		for _, pl := range page.Lists {
			list, _, err := api.List(ctx, pl.ListID)
			if errors.Is(err, partnerapi.ErrRejected) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("simulator: catalog walk: list %d: %w", pl.ListID, err)
			}
			for _, sum := range list.Mixes {
				if seen[sum.ID] {
					continue
				}
				seen[sum.ID] = true
				mix, _, err := api.Mix(ctx, sum.ID)
				if errors.Is(err, partnerapi.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("simulator: catalog walk: mix %d: %w", sum.ID, err)
				}
				info, err := mixInfo(mix)
				if err != nil {
					return nil, err
				}
				out = append(out, info)
				if maxMixes > 0 && len(out) == maxMixes {
					return out, nil
				}
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("simulator: catalog walk: the partner API listed no mix")
	}
	return out, nil
}

func mixInfo(m partnerapi.Mix) (MixInfo, error) {
	length, err := partnerapi.ParseHMS(m.Length)
	if err != nil {
		return MixInfo{}, fmt.Errorf("simulator: mix %d: length: %w", m.ID, err)
	}
	info := MixInfo{ID: m.ID, LengthMS: length}
	for _, t := range m.Tracks {
		s, err := partnerapi.ParseHMS(t.Time)
		if err != nil {
			return MixInfo{}, fmt.Errorf("simulator: mix %d: track %d time: %w", m.ID, t.ID, err)
		}
		info.TrackStartsMS = append(info.TrackStartsMS, s)
	}
	return info, nil
}

// Package confcheck words the range errors of configuration checks alike
// across playpipe's packages: "<field> must be <range>, got <value>". A
// Validate method lists its rules in order with Rule and returns First of
// them, so that the first field out of range names itself.
package confcheck

import "fmt"

// Rule returns nil when bad is false, otherwise the error
// "<field> must be <want>, got <got>" (got printed with %v). field carries
// the package prefix and the flag, e.g. "gateway: Config.MaxEvents (--max-events)";
// want the range, e.g. "≥ 1".
func Rule(bad bool, field, want string, got any) error {
	if !bad {
		return nil
	}
	return fmt.Errorf("%s must be %s, got %v", field, want, got)
}

// First returns the first of errs that is not nil, or nil when all are.
func First(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

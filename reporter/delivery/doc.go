// Package delivery is what one post of a royalty report means and what its
// Delivery record says: the one classifier of the partner API's answers and
// the one builder of Delivery records, shared by the reporter and by
// playpipe replay/redrive (package replay), so that both decide and label
// doubt alike (docs/design.md, "Delivering a report"; docs/reporter.md).
//
// Files: classify.go (Action, Decision, Classify: the outcome table),
// signal.go (Signal: what an answer tells the reporter's in-flight limit),
// delivery.go (Attempt, Doubt and New, the Delivery record's builder).
// Tests: classify_test.go, classify_doubt_test.go,
// classify_endpoint_test.go, delivery_test.go.
package delivery

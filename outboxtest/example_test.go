package outboxtest_test

import (
	"fmt"
	"testing"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// An adopter's test: the code under test writes its row and its record in
// one transaction; the test reads what the relay published.
func ExampleNew() {
	testPlaceOrder := func(t *testing.T) { // func TestPlaceOrder(t *testing.T) in your _test.go
		env := outboxtest.New(t, outboxtest.Options{})
		topic := env.Topic(t, 1)
		err := env.DB.Transaction(func(tx *gorm.DB) error {
			return outbox.Enqueue(tx, outbox.NewStringMessage(topic, "o-17", `{"id":"o-17"}`))
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range env.Records(t, topic, 1) {
			fmt.Printf("%s %s\n", r.Key, r.Value)
		}
	}
	_ = testPlaceOrder
}

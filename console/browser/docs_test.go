package browser_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/console"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// envDocsImages is the directory TestDocsScreenshots also writes the
// documentation's pictures to (docs/images), when set.
const envDocsImages = "CONSOLE_DOCS_IMAGES"

// The queues of the shop TestDocsScreenshots runs.
const (
	qOrders    = "orders.created"
	qInvoices  = "invoices.issued"
	qEmails    = "emails.send"
	qShipments = "shipments.booked"
)

// The shop's messages, each with the type name its publisher records in
// the message-type header.
type (
	money struct {
		Amount   string `json:"amount"`
		Currency string `json:"currency"`
	}
	orderLine struct {
		SKU       string `json:"sku"`
		Name      string `json:"name"`
		Quantity  int    `json:"quantity"`
		UnitPrice money  `json:"unit_price"`
	}
	orderCreated struct {
		OrderID       string      `json:"order_id"`
		CustomerID    string      `json:"customer_id"`
		Lines         []orderLine `json:"lines"`
		Total         money       `json:"total"`
		PaymentMethod string      `json:"payment_method"`
		Channel       string      `json:"channel"`
	}
	invoiceIssued struct {
		InvoiceID string `json:"invoice_id"`
		OrderID   string `json:"order_id"`
		AccountID string `json:"account_id"`
		Total     money  `json:"total"`
		DueDate   string `json:"due_date"`
	}
	invoiceReminder struct {
		InvoiceID string `json:"invoice_id"`
		AccountID string `json:"account_id"`
		Reminder  int    `json:"reminder"`
	}
	emailSend struct {
		To       string            `json:"to"`
		Template string            `json:"template"`
		Locale   string            `json:"locale"`
		Vars     map[string]string `json:"vars"`
	}
	// emailSendV2 is the next version of emailSend, which a publisher
	// deployed before its consumer writes.
	emailSendV2 struct {
		emailSend
		Attachments []string `json:"attachments"`
	}
	shipmentBooked struct {
		ShipmentID  string  `json:"shipment_id"`
		OrderID     string  `json:"order_id"`
		Carrier     string  `json:"carrier"`
		Service     string  `json:"service"`
		Parcels     int     `json:"parcels"`
		WeightKg    float64 `json:"weight_kg"`
		Country     string  `json:"country"`
		PostalCode  string  `json:"postal_code"`
		RequestedBy string  `json:"requested_by"`
	}
)

func (orderCreated) OutboxMessageType() string    { return "shop.order_created.v1" }
func (invoiceIssued) OutboxMessageType() string   { return "billing.invoice_issued.v1" }
func (invoiceReminder) OutboxMessageType() string { return "billing.invoice_reminder.v1" }
func (emailSend) OutboxMessageType() string       { return "mail.email_send.v1" }
func (emailSendV2) OutboxMessageType() string     { return "mail.email_send.v2" }
func (shipmentBooked) OutboxMessageType() string  { return "logistics.shipment_booked.v1" }

// catalog is what the shop sells.
var catalog = []struct {
	sku, name string
	cents     int
}{
	{"SKU-10421", "Merino crew sweater", 8900},
	{"SKU-20817", "Trail running shoes", 12950},
	{"SKU-31002", "Insulated bottle 750 ml", 2490},
	{"SKU-40233", "Rain shell jacket", 15900},
	{"SKU-51876", "Wool socks, 3 pairs", 1990},
	{"SKU-62210", "Canvas weekender bag", 7450},
}

// people are the shop's customers, by email address.
var people = []string{
	"ana.silva@example.com", "j.nakamura@example.org", "lena.fischer@example.de", "omar.haddad@example.net",
	"priya.raman@example.com", "tom.oconnor@example.ie", "marta.nowak@example.pl", "luca.rossi@example.it",
}

// shop makes the shop's messages: realistic, and the same on every run.
type shop struct {
	rnd                        *mrand.Rand
	order, invoice, shipment   int
	now                        time.Time
	mu                         sync.Mutex // the invoice publisher runs beside the test
	carriers, services, cities []string
}

func newShop() *shop {
	return &shop{
		rnd: mrand.New(mrand.NewPCG(7, 11)), order: 100200, invoice: 3900, shipment: 88100,
		now:      time.Now().UTC().Truncate(time.Second),
		carriers: []string{"dhl", "ups", "dpd", "gls"},
		services: []string{"express", "standard", "economy"},
		cities:   []string{"DE 10115", "FR 75003", "NL 1012", "AT 1010", "IT 20121", "ES 28004", "PL 00-001", "IE D02"},
	}
}

func cents(c int) money { return money{Amount: fmt.Sprintf("%d.%02d", c/100, c%100), Currency: "EUR"} }

// intn is a random number in [0, n).
func (s *shop) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rnd.IntN(n)
}

func (s *shop) customer() string { return fmt.Sprintf("cus_%04d", 1000+s.rnd.IntN(9000)) }

// nextOrder is an order of one to three lines.
func (s *shop) nextOrder() orderCreated { return s.orderOf(0) }

// orderOf is an order of lines lines, or of one to three when lines is 0.
func (s *shop) orderOf(lines int) orderCreated {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lines == 0 {
		lines = 1 + s.rnd.IntN(3)
	}
	s.order++
	o := orderCreated{
		OrderID: fmt.Sprintf("ord_%d", s.order), CustomerID: s.customer(),
		PaymentMethod: []string{"card", "card", "paypal", "sepa_debit"}[s.rnd.IntN(4)],
		Channel:       []string{"web", "web", "ios", "android"}[s.rnd.IntN(4)],
	}
	total := 0
	for range lines {
		c := catalog[s.rnd.IntN(len(catalog))]
		n := 1 + s.rnd.IntN(2)
		o.Lines = append(o.Lines, orderLine{SKU: c.sku, Name: c.name, Quantity: n, UnitPrice: cents(c.cents)})
		total += n * c.cents
	}
	o.Total = cents(total)
	return o
}

func (s *shop) nextInvoice() invoiceIssued {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.invoice++
	return invoiceIssued{
		InvoiceID: fmt.Sprintf("INV-2025-%06d", s.invoice), OrderID: fmt.Sprintf("ord_%d", 99000+s.invoice),
		AccountID: fmt.Sprintf("acc_%04d", 1000+s.rnd.IntN(9000)), Total: cents(1990 + s.rnd.IntN(40000)),
		DueDate: s.now.AddDate(0, 0, 14).Format(time.DateOnly),
	}
}

func (s *shop) nextEmail() emailSend {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.order++
	return emailSend{
		To: people[s.rnd.IntN(len(people))], Template: []string{"order-confirmation", "shipping-update", "invoice-available"}[s.rnd.IntN(3)],
		Locale: []string{"en-GB", "de-DE", "fr-FR"}[s.rnd.IntN(3)], Vars: map[string]string{"order_id": fmt.Sprintf("ord_%d", s.order)},
	}
}

func (s *shop) nextShipment() shipmentBooked {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shipment++
	city := strings.SplitN(s.cities[s.rnd.IntN(len(s.cities))], " ", 2)
	return shipmentBooked{
		ShipmentID: fmt.Sprintf("shp_%d", s.shipment), OrderID: fmt.Sprintf("ord_%d", 99500+s.shipment%1000),
		Carrier: s.carriers[s.rnd.IntN(len(s.carriers))], Service: s.services[s.rnd.IntN(len(s.services))],
		Parcels: 1 + s.rnd.IntN(3), WeightKg: float64(5+s.rnd.IntN(200)) / 10, Country: city[0], PostalCode: city[1],
		RequestedBy: "fulfilment-service",
	}
}

// headers are a message's headers beside the reserved ones, from the
// service that published it.
func (s *shop) headers(source string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string]string{
		"source":      source,
		"traceparent": fmt.Sprintf("00-%016x%016x-%016x-01", s.rnd.Uint64(), s.rnd.Uint64(), s.rnd.Uint64()),
	}
}

// opts are the options of one message of source: its headers and a
// request's correlation id.
func (s *shop) opts(source string) *outbox.PublishOpts {
	h := s.headers(source)
	s.mu.Lock()
	defer s.mu.Unlock()
	return &outbox.PublishOpts{Headers: h, CorrelationID: fmt.Sprintf("req_%012x", s.rnd.Uint64()>>16)}
}

// typed returns a JSON publisher of T to queue.
func typed[T any](t *testing.T, ob *outbox.Outbox, queue string) *outbox.Publisher[T] {
	t.Helper()
	pub, err := outbox.NewPublisher(ob, queue, &outbox.PublisherConfig[T]{Codec: outbox.JSONCodec[T]{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// one publishes msg with opts and returns its id.
func one[T any](t *testing.T, pool *pgxpool.Pool, pub *outbox.Publisher[T], msg T, opts *outbox.PublishOpts) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := pub.Publish(ctx, pool, msg, opts)
	if err != nil {
		t.Fatalf("publishing to %q: %v", pub.Queue(), err)
	}
	return id
}

// many publishes n messages that next makes, in batches sharing opts.
func many[T any](t *testing.T, pool *pgxpool.Pool, pub *outbox.Publisher[T], n int, next func() T, opts func() *outbox.PublishOpts) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for n > 0 {
		batch := make([]T, min(n, 500))
		for i := range batch {
			batch[i] = next()
		}
		if _, err := pub.PublishBatch(ctx, pool, batch, opts()); err != nil {
			t.Fatalf("publishing to %q: %v", pub.Queue(), err)
		}
		n -= len(batch)
	}
}

// keyed publishes a key's head, due after delay, and behind it more rows
// of the key, and returns the head's id.
func keyed[T any](t *testing.T, s *shop, pool *pgxpool.Pool, pub *outbox.Publisher[T], key, source string, delay time.Duration, behind int, next func() T) int64 {
	t.Helper()
	o := s.opts(source)
	o.OrderingKey, o.Delay = key, delay
	id := one(t, pool, pub, next(), o)
	for range behind {
		o := s.opts(source)
		o.OrderingKey = key
		one(t, pool, pub, next(), o)
	}
	return id
}

// verdict is what a handler of the scene's first subscribers does with a
// row.
type verdict struct {
	err    string // the handler's error
	reject bool   // fail the row for good: rejected
	hang   bool   // run until the lease is lost: max_deliveries in the end
	// later, when set, keeps the row: its attempt number retries waits
	// later for the next, the ones before it are retried at once.
	later   time.Duration
	retries int
}

// quickRetry is the scene's retry strategy: a failure is retried after
// 10 ms, three times, and then dead-lettered (retry_exhausted).
var quickRetry = outbox.ConstantRetry{Delay: 10 * time.Millisecond, MaxAttempts: 4}

func (v verdict) outcome(ctx context.Context, attempts int) error {
	err := errors.New(v.err)
	switch {
	case v.hang:
		<-ctx.Done()
		return context.Cause(ctx)
	case v.reject:
		return outbox.Reject(err)
	case v.later > 0 && attempts+1 < v.retries:
		return outbox.RetryAfter(err, 10*time.Millisecond)
	case v.later > 0:
		return outbox.RetryAfter(err, v.later)
	}
	return err
}

// background runs run until stop is called or the test ends; stop
// cancels its context and waits for it.
func background(t *testing.T, what string, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("%s: %v", what, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop within 30s", what)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// subscriber returns a subscriber of queues with handler and cfg, run
// until the returned stop is called or the test ends.
func subscriber[T any](t *testing.T, ob *outbox.Outbox, queues []string, handler outbox.Handler[T], cfg *outbox.SubscriberConfig[T]) (stop func()) {
	t.Helper()
	cfg.Logger, cfg.GracefulTimeout = quiet, 5*time.Second
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 20*time.Millisecond, 250*time.Millisecond
	sub, err := outbox.NewSubscriber(ob, queues, handler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return background(t, fmt.Sprintf("subscriber of %q", queues), sub.Run)
}

// sleep waits d, or less when ctx ends first.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// TestDocsScreenshots builds a shop's outbox in use and takes the
// console's pictures that docs/console.md and README.md show: four queues
// with a backlog (thousands of ready rows, scheduled rows, rows leased by a
// running subscriber with a slow handler, keys held by a leased head, a
// head waiting for its retry and a scheduled head), dead letters of every
// reason, a timer, and, while the Queues page is open, one queue draining
// and another filling, so that its chart moves. Each picture is saved with
// the test's screenshots and, when $CONSOLE_DOCS_IMAGES is set, there too.
//
// The rows are aged after they are written (their publication, and the
// dead letters' failures, spread over the last hours), so that the pages
// show the waits of an outbox that has run for a while rather than of one
// a test filled seconds ago.
func TestDocsScreenshots(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	start := time.Now()

	// A pool of its own: the subscribers, the publisher and the console
	// run at once.
	small := outboxtest.Connect(t)
	cfg := small.Config()
	cfg.MaxConns = 16
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The schema's name shows in the pictures: a short random suffix.
	var b [3]byte
	_, _ = rand.Read(b[:])
	f := newOutboxIn(t, pool, "shop_"+hex.EncodeToString(b[:]))
	ob := f.Outbox
	s := newShop()

	orders := typed[orderCreated](t, ob, qOrders)
	invoices := typed[invoiceIssued](t, ob, qInvoices)
	reminders := typed[invoiceReminder](t, ob, qInvoices)
	emails := typed[emailSend](t, ob, qEmails)
	emailsV2 := typed[emailSendV2](t, ob, qEmails)
	shipments := typed[shipmentBooked](t, ob, qShipments)
	checkout := func() *outbox.PublishOpts { return s.opts("checkout-service") }
	billing := func() *outbox.PublishOpts { return s.opts("billing-service") }
	notify := func() *outbox.PublishOpts { return s.opts("notification-service") }
	fulfilment := func() *outbox.PublishOpts { return s.opts("fulfilment-service") }

	// The rows that fail, and how: the first subscribers' handlers look
	// their verdict up by id.
	verdicts := map[int64]verdict{}
	fail := func(id int64, v verdict) int64 { verdicts[id] = v; return id }
	var (
		gateway503   = "payment gateway: 503 Service Unavailable"
		shown        int64 // the dead letter whose page the docs show
		timerID      = "invoice-reminder:INV-2025-003977"
		retryingKeys = map[string]int{} // key -> attempts of its head
	)
	for i := range 5 {
		msg := gateway503
		if i == 3 {
			msg = `payment gateway: Post "https://pay.example.net/v1/charges": i/o timeout`
		}
		lines := 0
		if i == 1 { // its page shows its payload whole
			lines = 1
		}
		id := fail(one(t, pool, orders, s.orderOf(lines), checkout()), verdict{err: msg})
		if i == 1 {
			shown = id
		}
	}
	fail(one(t, pool, orders, s.nextOrder(), checkout()), verdict{reject: true, err: "fraud check: order scored 0.97, above the limit of 0.90"})
	fail(one(t, pool, orders, s.nextOrder(), checkout()), verdict{reject: true, err: "customer cus_3390 is suspended"})
	for range 3 {
		fail(one(t, pool, invoices, s.nextInvoice(), billing()), verdict{reject: true, err: "billing: account has no billing address"})
	}
	fail(one(t, pool, invoices, s.nextInvoice(), billing()), verdict{err: "pdf renderer: signal: killed (out of memory)"})
	o := billing()
	o.TimerID = timerID
	fail(one(t, pool, reminders, invoiceReminder{InvoiceID: "INV-2025-003977", AccountID: "acc_6120", Reminder: 1}, o),
		verdict{reject: true, err: "invoice INV-2025-003977: reminder sent before the due date"})
	retryingKeys["account:acc_9120"] = 2
	fail(keyed(t, s, pool, invoices, "account:acc_9120", "billing-service", 0, 3, s.nextInvoice),
		verdict{err: "tax service: 429 Too Many Requests", retries: 2, later: 8 * time.Minute})
	for range 2 {
		fail(one(t, pool, shipments, s.nextShipment(), fulfilment()),
			verdict{err: `carrier API: Post "https://api.carrier.example/v2/bookings": 502 Bad Gateway`})
	}
	// emails.send: two rows its consumer cannot decode (a cut-off
	// payload, and a version it does not know yet), a handler that hangs
	// until its lease runs out, a rejected address, and a key whose head
	// waits for its retry.
	publish(t, f, jsonBytes{}, qEmails, []byte(`{"to":"marta.nowak@example.pl","template":"order-confirmation","locale":"pl-PL","vars":{"order_id":"ord_100`), notify())
	v2 := emailSendV2{emailSend: s.nextEmail(), Attachments: []string{"invoice-INV-2025-003981.pdf"}}
	one(t, pool, emailsV2, v2, notify())
	fail(one(t, pool, emails, emailSend{To: "tom.oconnor@example.ie", Template: "invoice-available", Locale: "en-GB",
		Vars: map[string]string{"invoice_id": "INV-2025-003990", "attachment": "invoice-INV-2025-003990.pdf"}}, notify()), verdict{hang: true})
	fail(one(t, pool, emails, emailSend{To: "j.doe@example.org", Template: "order-confirmation", Locale: "en-GB",
		Vars: map[string]string{"order_id": "ord_100311"}}, notify()),
		verdict{reject: true, err: "smtp: 550 5.1.1 <j.doe@example.org>: Recipient address rejected: User unknown"})
	retryingKeys["customer:cus_7731"] = 3
	fail(keyed(t, s, pool, emails, "customer:cus_7731", "notification-service", 0, 4, s.nextEmail),
		verdict{err: "smtp: 421 4.7.0 Try again later, closing connection", retries: 3, later: 14 * time.Minute})
	const wantDead = 18

	// The first subscribers fail those rows; then they stop.
	handle := func(ctx context.Context, id int64, attempts int) error {
		if v, ok := verdicts[id]; ok {
			return v.outcome(ctx, attempts)
		}
		return nil
	}
	stopShop := subscriber(t, ob, []string{qOrders, qInvoices, qShipments},
		func(ctx context.Context, m *outbox.Message[[]byte]) error { return handle(ctx, m.ID, m.Attempts) },
		&outbox.SubscriberConfig[[]byte]{Codec: outbox.BytesCodec{}, Retry: quickRetry})
	// The mailer decodes emailSend; its leases are short and never
	// extended, so a hanging handler loses its row, which is claimed again
	// until it has been claimed too often. The key's head needs three
	// deliveries of the four allowed, so one of its claims may outlive its
	// two-second lease on a loaded machine without dead-lettering it. Its
	// retries outlast its deliveries: the hanging row, whose every lost
	// lease is a failed attempt too, ends as max_deliveries.
	mailerRetry := quickRetry
	mailerRetry.MaxAttempts = 8
	stopMailer := subscriber(t, ob, []string{qEmails},
		func(ctx context.Context, m *outbox.Message[emailSend]) error { return handle(ctx, m.ID, m.Attempts) },
		&outbox.SubscriberConfig[emailSend]{Retry: mailerRetry, LeaseTTL: 2 * time.Second,
			HeartbeatInterval: -1, LockWindow: -1, MaxDeliveries: 4})
	eventually(t, "the first subscribers dead-letter their rows and leave the keys' heads waiting for their retry", time.Minute,
		func(ctx context.Context) (bool, error) {
			n, err := ob.CountDeadLetters(ctx, outbox.DeadLetterFilter{})
			if err != nil {
				return false, err
			}
			keys, err := ob.HeldKeys(ctx, &outbox.HeldKeyOptions{})
			if err != nil {
				return false, err
			}
			got := map[string]int{}
			for _, k := range keys {
				if k.State == outbox.HeadRetrying && k.Until > time.Minute {
					got[k.Key] = k.Attempts
				}
			}
			if n != wantDead || !cmp.Equal(got, retryingKeys) {
				return false, fmt.Errorf("%d dead letters (want %d), heads waiting for their retry: %v (want %v)", n, wantDead, got, retryingKeys)
			}
			return true, nil
		})
	stopShop()
	stopMailer()
	reasons := map[string]int{}
	for _, d := range deadLetters(t, ob, outbox.DeadLetterFilter{}) {
		reasons[d.Reason]++
	}
	if diff := cmp.Diff(map[string]int{outbox.ReasonRetryExhausted: 8, outbox.ReasonRejected: 7, outbox.ReasonDecodeError: 2, outbox.ReasonMaxDeliveries: 1}, reasons); diff != "" {
		t.Errorf("dead letters by reason (-want +got):\n%s", diff)
	}
	t.Logf("dead letters and retrying heads after %v", time.Since(start).Round(time.Millisecond))

	// The backlog. shipments.booked first, its keys' heads oldest, so
	// that its slow subscriber claims them first and holds them.
	leasedKeys := []string{"shipment:shp_88213", "shipment:shp_88240"}
	for i, key := range leasedKeys {
		keyed(t, s, pool, shipments, key, "fulfilment-service", 0, 3-i, s.nextShipment)
	}
	// Keys held by a scheduled head.
	scheduledKeys := []string{"account:acc_5531", "customer:cus_1044"}
	keyed(t, s, pool, invoices, scheduledKeys[0], "billing-service", 20*time.Minute, 2, s.nextInvoice)
	keyed(t, s, pool, emails, scheduledKeys[1], "notification-service", 45*time.Minute, 2, s.nextEmail)
	many(t, pool, shipments, 262, s.nextShipment, fulfilment)
	many(t, pool, orders, 3164, s.nextOrder, checkout)
	many(t, pool, invoices, 1427, s.nextInvoice, billing)
	many(t, pool, emails, 417, s.nextEmail, notify)
	// Scheduled rows: invoice reminders, and emails held for the night.
	for _, d := range []time.Duration{2 * time.Hour, 5 * time.Hour, 26 * time.Hour} {
		i := 0
		many(t, pool, reminders, 12, func() invoiceReminder {
			i++
			return invoiceReminder{InvoiceID: fmt.Sprintf("INV-2025-%06d", 3700+i), AccountID: s.customer(), Reminder: 1}
		}, func() *outbox.PublishOpts { o := billing(); o.Delay = d; return o })
	}
	many(t, pool, emails, 14, s.nextEmail, func() *outbox.PublishOpts { o := notify(); o.Delay = 7 * time.Hour; return o })
	// Timers: a new reminder holds the timer id of the dead-lettered one.
	o = billing()
	o.TimerID, o.Delay = timerID, 23*time.Hour
	one(t, pool, reminders, invoiceReminder{InvoiceID: "INV-2025-003977", AccountID: "acc_6120", Reminder: 2}, o)
	o = billing()
	o.TimerID, o.Delay = "invoice-reminder:INV-2025-004102", 71*time.Hour
	one(t, pool, reminders, invoiceReminder{InvoiceID: "INV-2025-004102", AccountID: "acc_2291", Reminder: 1}, o)
	ageRows(t, f, map[string]time.Duration{
		qOrders: 42 * time.Minute, qInvoices: 9 * time.Minute, qEmails: 85 * time.Minute, qShipments: 18 * time.Minute,
	}, 5*time.Hour+30*time.Minute)

	// shipments.booked's subscriber is slow: a booking takes the carrier
	// a second or two, and the two keys' heads wait for the carrier until
	// the test ends.
	release := make(chan struct{})
	stopCarrier := subscriber(t, ob, []string{qShipments},
		func(ctx context.Context, m *outbox.Message[[]byte]) error {
			if slices.Contains(leasedKeys, m.OrderingKey) {
				select {
				case <-ctx.Done():
				case <-release:
				}
				return nil
			}
			sleep(ctx, time.Duration(1200+m.ID%1300)*time.Millisecond)
			return nil
		},
		&outbox.SubscriberConfig[[]byte]{Codec: outbox.BytesCodec{}, Workers: 4, FetchBatchSize: 6, LockWindow: -1})
	t.Cleanup(func() { close(release); stopCarrier() })
	eventually(t, "the carrier's subscriber holds the keys' heads", 20*time.Second, func(ctx context.Context) (bool, error) {
		keys, err := ob.HeldKeys(ctx, &outbox.HeldKeyOptions{Queues: []string{qShipments}})
		n := 0
		for _, k := range keys {
			if k.State == outbox.HeadLeased {
				n++
			}
		}
		return n == len(leasedKeys), err
	})
	t.Logf("scene built after %v", time.Since(start).Round(time.Millisecond))

	h, err := console.New(console.Config{Pool: pool, Actions: true, Refresh: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	p := newPage(t, srv.URL)
	base := outboxPath(f)

	// The Queues page, while orders.created drains and invoices.issued
	// fills; its script reloads the counts every second, one sample of
	// the chart each.
	p.open(base + "/")
	// Both go in waves: the payment gateway's latency swings, and so do
	// the shop's sales.
	t0 := time.Now()
	wave := func(period time.Duration) float64 {
		return (1 + math.Sin(2*math.Pi*float64(time.Since(t0))/float64(period))) / 2
	}
	stopDrain := subscriber(t, ob, []string{qOrders}, func(ctx context.Context, m *outbox.Message[[]byte]) error {
		sleep(ctx, time.Duration(10+26*wave(5*time.Second))*time.Millisecond)
		return nil
	}, &outbox.SubscriberConfig[[]byte]{Codec: outbox.BytesCodec{}, Workers: 4, FetchBatchSize: 40})
	stopSales := background(t, "publishing orders and invoices", func(ctx context.Context) error {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
			newOrders := make([]orderCreated, s.intn(12))
			for i := range newOrders {
				newOrders[i] = s.nextOrder()
			}
			newInvoices := make([]invoiceIssued, max(0, 4+int(24*wave(7*time.Second))+s.intn(9)-4))
			for i := range newInvoices {
				newInvoices[i] = s.nextInvoice()
			}
			if _, err := orders.PublishBatch(ctx, pool, newOrders, checkout()); err != nil && ctx.Err() == nil {
				return err
			}
			if _, err := invoices.PublishBatch(ctx, pool, newInvoices, billing()); err != nil && ctx.Err() == nil {
				return err
			}
		}
	})
	const samples = 13
	eventually(t, fmt.Sprintf("the chart of the Queues page holds %d samples", samples), 30*time.Second, func(context.Context) (bool, error) {
		lines := p.chartLines()
		return len(lines) == 4 && slices.ContainsFunc(lines, func(l chartLine) bool { return len(l.Points) >= samples }), nil
	})
	trends := map[string]int{}
	for _, l := range p.chartLines() {
		if len(l.Points) < 3 {
			t.Errorf("Queues page: the line of %s has %d points, want at least 3", l.Queue, len(l.Points))
		}
		if l.Queue != qShipments { // its slow subscriber may or may not have finished a row
			trends[l.Queue] = l.trend()
		}
	}
	if diff := cmp.Diff(map[string]int{qOrders: -1, qInvoices: +1, qEmails: 0}, trends); diff != "" {
		t.Errorf("Queues page: the chart's lines go (-1 down, +1 up; -want +got):\n%s", diff)
	}
	for _, q := range []string{qOrders, qInvoices, qEmails, qShipments} {
		if n := parseCount(t, p.text("table#queues tr.queue[data-queue="+cssString(q)+"] td.ready")); n < 200 {
			t.Errorf("Queues page: %s has %d ready rows, want a backlog", q, n)
		}
	}
	if n := parseCount(t, p.text("table#queues tr.queue[data-queue="+cssString(qShipments)+"] td.leased")); n < len(leasedKeys) {
		t.Errorf("Queues page: %s has %d leased rows, want at least %d", qShipments, n, len(leasedKeys))
	}
	// The subscribers at work, from their presence records.
	if n := p.count("table#subscribers tr.subscriber"); n == 0 {
		t.Errorf("Queues page: no running subscriber listed")
	}
	p.docShot("console-outbox.png")

	// One queue: its counts, its chart, its held keys.
	p.click("table#queues tr.queue[data-queue=" + cssString(qInvoices) + "] a.queue-link")
	p.do("waiting for the queue's chart", chromedp.WaitVisible(chromedp.CSS("#live svg.chart")))
	if diff := cmp.Diff(map[string]string{"account:acc_9120": outbox.HeadRetrying, scheduledKeys[0]: outbox.HeadScheduled}, p.heldKeys()); diff != "" {
		t.Errorf("queue page of %s: held keys (-want +got):\n%s", qInvoices, diff)
	}
	if n := p.count("#live svg.chart polyline"); n != 5 {
		t.Errorf("queue page: %d lines in the chart, want 5 (ready, scheduled, leased, blocked, dead)", n)
	}
	p.docShot("console-queue.png")

	// The queue's scheduled rows, by due time.
	p.click(`a.queue-rows[href$="state=scheduled"]`)
	if n := p.count("table#rows tr.row"); n == 0 {
		t.Errorf("rows page of %s: no scheduled row listed", qInvoices)
	}
	p.docShot("console-rows.png")
	stopDrain()
	stopSales()

	// Every held key: leased, retrying and scheduled heads.
	p.open(base + "/keys")
	want := map[string]string{}
	for _, k := range leasedKeys {
		want[k] = outbox.HeadLeased
	}
	for k := range retryingKeys {
		want[k] = outbox.HeadRetrying
	}
	for _, k := range scheduledKeys {
		want[k] = outbox.HeadScheduled
	}
	if diff := cmp.Diff(want, p.heldKeys()); diff != "" {
		t.Errorf("held keys (-want +got):\n%s", diff)
	}
	p.docShot("console-keys.png")

	// The dead letters of orders.created, as the filter finds them.
	p.open(base + "/dead")
	p.do("filtering by queue", chromedp.SetValue(chromedp.CSS(`form#dead-filter input[name="q"]`), qOrders))
	p.click("form#dead-filter button#filter")
	if q := p.query(); q.Get("q") != qOrders {
		t.Errorf("filter led to %s, want q=%s", p.path(), qOrders)
	}
	var wantIDs []int64
	for _, d := range deadLetters(t, ob, outbox.DeadLetterFilter{Queue: qOrders}) {
		wantIDs = append(wantIDs, d.ID)
	}
	if len(wantIDs) != 7 {
		t.Errorf("%s has %d dead letters, want 7", qOrders, len(wantIDs))
	}
	if diff := cmp.Diff(sorted(wantIDs...), p.deadIDs()); diff != "" {
		t.Errorf("dead letters of %s (-want +got):\n%s", qOrders, diff)
	}
	if qs := eval[[]string](p, `[...document.querySelectorAll('table#dead tr.dead td.queue')].map(td => td.textContent.trim())`); slices.ContainsFunc(qs, func(q string) bool { return q != qOrders }) {
		t.Errorf("dead letters filtered by %s list queues %q", qOrders, qs)
	}
	// Why they failed: the gateway's 503s, numbers written as #, the
	// largest group.
	if got := p.text("table#causes tr.cause td.error-text"); got != "payment gateway: # Service Unavailable" {
		t.Errorf("dead letters of %s: the largest cause is %q", qOrders, got)
	}
	p.docShot("console-dead-letters.png")

	// One of them.
	p.click("table#dead tr.dead[data-id=" + cssString(id(shown)) + "] a.dead-link")
	if got := p.text("pre#last-error"); !strings.Contains(got, gateway503) {
		t.Errorf("dead letter %d: last error %q, want %q", shown, got, gateway503)
	}
	if got := strings.TrimSpace(p.text("dl#meta dd.reason")); got != outbox.ReasonRetryExhausted {
		t.Errorf("dead letter %d: reason %q, want %s", shown, got, outbox.ReasonRetryExhausted)
	}
	var payload orderCreated
	if err := json.Unmarshal([]byte(p.text("pre#payload")), &payload); err != nil || payload.OrderID == "" {
		t.Errorf("dead letter %d: payload is not an order (%v): %s", shown, err, p.text("pre#payload"))
	}
	headers := p.text("table#headers")
	for _, h := range []string{outbox.HeaderContentType, outbox.ContentTypeJSON, outbox.HeaderMessageType, "shop.order_created.v1", outbox.HeaderCorrelationID, "traceparent"} {
		if !strings.Contains(headers, h) {
			t.Errorf("dead letter %d: headers %q do not show %q", shown, headers, h)
		}
	}
	p.docShot("console-dead-letter.png")

	// A replay of invoices.issued's dead letters, up to its dry run: one
	// stays, as its timer id is taken again.
	p.open(base + "/dead?q=" + url.QueryEscape(qInvoices))
	p.click("button#replay-filter")
	p.shot("replay-count.png")
	p.click("button#dry-run")
	if got, want := p.text("p#dry-result"), "4 rows would go back to the outbox, 1 row would stay"; !strings.Contains(got, want) {
		t.Errorf("replay dry run: %q, want it to say %q", got, want)
	}
	if got := p.text("ul.details"); !strings.Contains(got, strconv.Quote(timerID)) {
		t.Errorf("replay dry run: details %q do not name the timer id %q", got, timerID)
	}
	p.docShot("console-replay-dry-run.png")
	if n := countDeadLetters(t, ob, outbox.DeadLetterFilter{}); n != wantDead {
		t.Errorf("after the dry run: %d dead letters, want %d", n, wantDead)
	}

	p.open(base + "/health")
	if !p.has("dl#health dd.notify") {
		t.Errorf("health page: no dl#health")
	}
	p.docShot("console-health.png")
	t.Logf("done after %v", time.Since(start).Round(time.Millisecond))
}

// ageRows spreads the publication of each queue's rows that are not
// leased over the age given for the queue, oldest id first (a row that is
// due now was due since it was published), and the dead letters' failures
// over deadAge, each a little off an even spread; then it vacuums the
// tables, as autovacuum would have by then.
func ageRows(t *testing.T, f *outboxtest.Fixture, ages map[string]time.Duration, deadAge time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// spread is, for each row, the fraction of its age: its rank from the
	// newest among the rows, moved by up to 0.4 of a rank.
	const spread = `(count(*) OVER () - row_number() OVER (ORDER BY id) + ((id * 7919) % 101)::float8 / 101 * 0.8 - 0.4) / count(*) OVER ()`
	table := pgx.Identifier{f.Schema, f.Outbox.Table()}.Sanitize()
	for q, age := range ages {
		if _, err := f.Pool.Exec(ctx, `
			WITH r AS (SELECT id, `+spread+` AS f FROM `+table+` WHERE queue = $1 AND acquired_token IS NULL)
			UPDATE `+table+` AS o
			SET created_at = now() - make_interval(secs => $2 * r.f + 5),
			    next_attempt_at = CASE WHEN o.next_attempt_at <= now() THEN now() - make_interval(secs => $2 * r.f + 5)
			                           ELSE o.next_attempt_at END
			FROM r WHERE o.id = r.id`, q, age.Seconds()); err != nil {
			t.Fatalf("ageing %s: %v", q, err)
		}
	}
	dlq := pgx.Identifier{f.Schema, f.Outbox.Table() + "_dlq"}.Sanitize()
	if _, err := f.Pool.Exec(ctx, `
		WITH r AS (SELECT id, `+spread+` AS f FROM `+dlq+`)
		UPDATE `+dlq+` AS d
		SET failed_at = now() - make_interval(secs => $1 * r.f + 300),
		    created_at = now() - make_interval(secs => $1 * r.f + 300 + 20 + 45 * d.attempts_count)
		FROM r WHERE d.id = r.id`, deadAge.Seconds()); err != nil {
		t.Fatalf("ageing the dead letters: %v", err)
	}
	for _, tbl := range []string{table, dlq} {
		if _, err := f.Pool.Exec(ctx, "VACUUM (ANALYZE) "+tbl); err != nil {
			t.Fatalf("vacuuming %s: %v", tbl, err)
		}
	}
}

// chartLine is a line of a page's chart: the queue its legend names and
// its points.
type chartLine struct {
	Queue  string      `json:"queue"`
	Points [][2]string `json:"points"`
}

// trend is -1 when the line's value went down from its first point to its
// last, +1 when it went up, 0 when it stayed (y grows downwards).
func (l chartLine) trend() int {
	if len(l.Points) < 2 {
		return 0
	}
	first, _ := strconv.ParseFloat(l.Points[0][1], 64)
	last, _ := strconv.ParseFloat(l.Points[len(l.Points)-1][1], 64)
	switch {
	case last > first:
		return -1
	case last < first:
		return +1
	}
	return 0
}

// chartLines returns the lines of the chart in the page's live region.
func (p *page) chartLines() []chartLine {
	p.t.Helper()
	return eval[[]chartLine](p, `[...document.querySelectorAll('#live svg.chart polyline')].map(l => {
		const cls = [...l.classList].find(c => /^s[0-9]+$/.test(c));
		const legend = document.querySelector('#live figcaption .legend.' + cls);
		return {
			queue: legend ? legend.textContent.replace(/:[^:]*$/, '').trim() : '',
			points: l.getAttribute('points').trim().split(/\s+/).map(p => p.split(',')),
		};
	})`)
}

// heldKeys returns the state of each key table#keys lists.
func (p *page) heldKeys() map[string]string {
	p.t.Helper()
	return eval[map[string]string](p, `Object.fromEntries([...document.querySelectorAll('table#keys tr.key')].map(r =>
		[r.dataset.key, r.querySelector('td.state').textContent.trim().split(/\s+/)[0]]))`)
}

// parseCount reads a count as the console prints it ("3,412", "≥ 10,000").
func parseCount(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.NewReplacer(",", "", "≥", "", " ", "").Replace(strings.TrimSpace(s)))
	if err != nil {
		t.Errorf("count %q: %v", s, err)
	}
	return n
}

// docShot saves a screenshot of the page's content (not of the window
// below it) as name, with the test's screenshots and, when
// $CONSOLE_DOCS_IMAGES is set, in that directory.
func (p *page) docShot(name string) {
	p.t.Helper()
	png := run(p, "screenshot "+name, chromedp.Screenshot(chromedp.CSS("body")))
	dirs := []string{p.dir}
	if d := os.Getenv(envDocsImages); d != "" {
		dirs = append(dirs, d)
	}
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			p.t.Fatal(err)
		}
	}
	p.t.Logf("%s: %d bytes", name, len(png))
}

package outbox

import (
	"reflect"
	"testing"
)

// TestSubscriberSettingsCopyEveryField holds subscriberSettings to
// SubscriberConfig: every field but Codec, of the same type, and settings
// and set copy each one, so a field added to the config cannot be dropped
// on its way to the engine.
func TestSubscriberSettingsCopyEveryField(t *testing.T) {
	t.Parallel()
	ct, st := reflect.TypeFor[SubscriberConfig[string]](), reflect.TypeFor[subscriberSettings]()
	var want []string
	for f := range ct.Fields() {
		if f.Name == "Codec" {
			continue
		}
		want = append(want, f.Name)
		g, ok := st.FieldByName(f.Name)
		if !ok || g.Type != f.Type {
			t.Errorf("subscriberSettings.%s: %v, %v; want a field of type %v", f.Name, g.Type, ok, f.Type)
		}
	}
	if st.NumField() != len(want) {
		t.Errorf("subscriberSettings has %d fields, SubscriberConfig %d besides Codec", st.NumField(), len(want))
	}

	// Every field set to something other than its zero value.
	var c SubscriberConfig[string]
	cv := reflect.ValueOf(&c).Elem()
	for i := range cv.NumField() {
		f := cv.Field(i)
		f = reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Elem() // unexported fields too
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Int, reflect.Int64:
			f.SetInt(7)
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Func:
			f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value { return nil }))
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Interface:
			switch f.Type() {
			case reflect.TypeFor[RetryStrategy]():
				f.Set(reflect.ValueOf(RetryStrategy(&ExponentialRetry{})))
			case reflect.TypeFor[Codec[string]]():
				f.Set(reflect.ValueOf(Codec[string](StringCodec{})))
			default:
				f.Set(reflect.ValueOf(struct {
					MetricsRecorder
					DeliveryObserver
				}{}))
			}
		default:
			t.Fatalf("field %s of kind %s: teach this test to set it", cv.Type().Field(i).Name, f.Kind())
		}
		if f.IsZero() {
			t.Fatalf("field %s is still zero", cv.Type().Field(i).Name)
		}
	}
	set := c.settings()
	var back SubscriberConfig[string]
	back.set(&set)
	bv := reflect.ValueOf(&back).Elem()
	for i := range cv.NumField() {
		name := cv.Type().Field(i).Name
		if name == "Codec" {
			continue
		}
		a := reflect.NewAt(cv.Field(i).Type(), cv.Field(i).Addr().UnsafePointer()).Elem()
		b := reflect.NewAt(bv.Field(i).Type(), bv.Field(i).Addr().UnsafePointer()).Elem()
		same := a.Kind() == reflect.Func && a.Pointer() == b.Pointer() || a.Kind() != reflect.Func && a.Interface() == b.Interface()
		if !same {
			t.Errorf("%s did not survive settings and set: %v, then %v", name, a, b)
		}
	}
}

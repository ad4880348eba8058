package rbac

import (
	"context"
	"reflect"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// mustReviewScrapes checks that cfg may make the two reviews /metrics
// asks the API server for on every scrape (pkg/app's MetricsServer): a
// TokenReview of the scraper's token and a SubjectAccessReview of its get
// on /metrics. Both answer, here, that nobody is let in.
func mustReviewScrapes(t *testing.T, name string, cfg *rest.Config) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: "not-a-token"}}, metav1.CreateOptions{})
	mustAllow(t, err, name+": create a TokenReview")
	if err == nil && tr.Status.Authenticated {
		t.Errorf("%s: TokenReview authenticated a made-up token", name)
	}
	sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:                  "system:serviceaccount:default:nobody",
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}}, metav1.CreateOptions{})
	mustAllow(t, err, name+": create a SubjectAccessReview")
	if err == nil && sar.Status.Allowed {
		t.Errorf("%s: a ServiceAccount bound to nothing may get /metrics", name)
	}
}

// mustBeMetricsReader checks the ClusterRole scrapers are bound to: get on
// /metrics and nothing else.
func mustBeMetricsReader(t *testing.T, admin *rest.Config) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(rest.CopyConfig(admin))
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.RbacV1().ClusterRoles().Get(context.Background(), "localdir-metrics-reader", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the ClusterRole for scrapers: %v", err)
	}
	want := rbacv1.PolicyRule{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}
	if len(r.Rules) != 1 || !reflect.DeepEqual(r.Rules[0], want) {
		t.Errorf("localdir-metrics-reader rules %+v, want only %+v", r.Rules, want)
	}
}

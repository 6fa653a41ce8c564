# What operators watch: the chart's PrometheusRule (templates/prometheusrule.yaml) and Grafana dashboards
# (dashboards/*.json), documented in docs/metrics.md and docs/runbook.md.
#
#   make alerts-check   promtool check + unit tests of the alerts (deploy/tests/alerts.test.yaml), on the rules as
#                       the chart renders them with its default thresholds; part of `make test` (CHECKS)
#
# promtool and prometheus come from Debian's `prometheus` package: promtool here, the real Prometheus in
# deploy-tests/tests/it/prometheus.rs (an integration test: the package is installed before those run).

PROMTOOL := /usr/bin/promtool
SYSTEM_PACKAGES += prometheus
CHECKS += alerts-check

.PHONY: alerts-check
alerts-check: system-packages $(HELM)
	@rules=$$(mktemp -d); trap 'rm -rf "$$rules"' EXIT; \
	$(HELM) template peerpods $(CHART) --namespace peerpods-system --kube-version $(KUBE_VERSION) \
	  -f $(ROOT)/deploy/tests/values-dev.yaml --set prometheusRule.enabled=true \
	  --show-only templates/prometheusrule.yaml 2>/dev/null \
	  | sed -n '/^spec:/,$$p' | sed '1d; s/^  //' > "$$rules/rules.yaml"; \
	test -s "$$rules/rules.yaml" || { echo "the chart rendered no PrometheusRule"; exit 1; }; \
	cp $(ROOT)/deploy/tests/alerts.test.yaml "$$rules/"; \
	$(PROMTOOL) check rules "$$rules/rules.yaml" && $(PROMTOOL) test rules "$$rules/alerts.test.yaml"

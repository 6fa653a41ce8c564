# AWS provider: its tests run the real AWS SDK against moto server (an EC2 emulator from PyPI),
# which the tests start themselves from the shared venv (.tools/venv, created in provider.mk).

MOTO_VERSION := 5.2.5
MOTO_STAMP := $(TOOLS)/venv/.moto-$(MOTO_VERSION)

TEST_PREREQS += moto

.PHONY: moto
moto: $(MOTO_STAMP)

$(MOTO_STAMP): | $(TOOLS)/venv/bin/python
	$(TOOLS)/venv/bin/pip install --quiet --disable-pip-version-check 'moto[ec2,server]==$(MOTO_VERSION)'
	@touch $@

"""Settings to concrete adapters: the only module that names them."""

from __future__ import annotations

import logging

from reconciler.adapters.alerts import (
    Alerter,
    AlertmanagerAlerter,
    FanOut,
    LogAlerter,
    WebhookAlerter,
)
from reconciler.adapters.discovery import HostsFileResolver, Resolver, SystemResolver
from reconciler.adapters.git import GitSource
from reconciler.adapters.triton import TritonServerClient
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.model.spec import TritonServer


def new_client(server: TritonServer, settings: Settings) -> TritonServerClient:
    return TritonServerClient.for_server(
        server,
        load_timeout=settings.load_timeout,
        call_timeout=settings.call_timeout,
        config_recheck=settings.config_recheck,
    )


def git_source(source: Source, settings: Settings) -> GitSource:
    return GitSource(
        source.repo, settings.cache_dir, settings.fetch_timeout, settings.git_credentials
    )


def resolver(settings: Settings) -> Resolver:
    return HostsFileResolver(settings.hosts_file) if settings.hosts_file else SystemResolver()


def alerter(settings: Settings) -> FanOut:
    alerters: list[Alerter] = [LogAlerter(logging.getLogger("triton_gitops.alerts"))]
    if settings.alertmanager_url:
        alerters.append(AlertmanagerAlerter(settings.alertmanager_url))
    if settings.alert_webhook:
        alerters.append(WebhookAlerter(settings.alert_webhook))
    return FanOut(alerters)

"""``/api/v1/docs`` renders from the install alone (issue 16): the live server's page names only
its own assets, every one of them answers, and the schema it loads is served for a browser."""

from __future__ import annotations

import re
import urllib.request

import pytest
import yaml

from tests.agent.processes import ControlPlane

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def fetch(url: str, accept: str = "text/html,*/*;q=0.8") -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=15) as answer:
        return answer.status, answer.headers["Content-Type"], answer.read()


def test_the_docs_page_and_all_it_loads_come_from_this_server(tmp_path):
    plane = ControlPlane(tmp_path)
    try:
        plane.start()
        status, kind, page = fetch(plane.url + "/api/v1/docs")
        html = page.decode()
        assert status == 200 and kind.startswith("text/html") and "SwaggerUIBundle" in html
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert assets and all(a.startswith("/static/drf_spectacular_sidecar/") for a in assets), assets
        assert not re.search(r"""(?:src|href|url)\s*[=:]\s*["']https?://""", html)
        assert '"validatorUrl": null' in html  # no badge fetched from validator.swagger.io
        kinds = {}
        for asset in assets:
            asset_status, asset_kind, body = fetch(plane.url + asset)
            assert asset_status == 200 and body, asset
            kinds[asset.rsplit(".", 1)[-1]] = asset_kind.split(";")[0]
        assert kinds == {"png": "image/png", "css": "text/css", "js": "text/javascript"}
        schema_url = re.search(r'url: "([^"]+)"', html).group(1)
        status, kind, schema = fetch(plane.url + schema_url)
        assert status == 200 and kind.startswith("text/plain")  # shown by a browser, not downloaded
        assert yaml.safe_load(schema)["openapi"].startswith("3.")
    finally:
        plane.stop()

"""The detail page's log history query, checked field by field."""

from __future__ import annotations

from typing import Any

from django import forms


class EventHistoryForm(forms.Form):
    """The query of the detail page's log history (?before= or ?after=, &limit=, &kind=, &q=):
    each bad value is an error naming its parameter and what it takes."""

    KINDS = ("log", "build", "phase", "status", "diagnosis", "alert", "selfcheck")
    MAX_LIMIT = 1000

    before = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    after = forms.IntegerField(required=False, min_value=0, max_value=2**63 - 1)
    limit = forms.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT)
    kind = forms.CharField(required=False, max_length=200)
    q = forms.CharField(required=False, max_length=200, strip=False)

    def clean_kind(self) -> frozenset[str]:
        kinds = frozenset(k.strip() for k in self.cleaned_data["kind"].split(",") if k.strip())
        unknown = sorted(kinds - set(self.KINDS))
        if unknown:
            raise forms.ValidationError(
                f"unknown kind {', '.join(unknown)}: use one or more of {', '.join(self.KINDS)}"
                " separated by commas")
        return kinds

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("before") is not None and data.get("after") is not None:
            raise forms.ValidationError("give before= (older lines) or after= (newer), not both")
        return data

    def errors_by_field(self) -> dict[str, list[str]]:
        return {("query" if name == "__all__" else name): [str(m) for m in messages]
                for name, messages in self.errors.items()}

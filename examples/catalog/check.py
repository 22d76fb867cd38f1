#!/usr/bin/env python3
"""Checks a catalog file against docs/catalog-format.md (stdlib only).

    python3 examples/catalog/check.py                 # demo.json next to this script
    python3 examples/catalog/check.py FILE.json
    python3 examples/catalog/check.py --rules-only FILE.json

Three groups of checks, every problem printed as `<JSON path>: <message>` (paths as the importer
writes them, e.g. `products[3].variants[0].pax`):

1. shape: only documented fields (the importer refuses unknown ones), no duplicate keys, the JSON
   types the fields need (integers where the importer reads integers), required fields present;
2. the rules listed at the bottom of docs/catalog-format.md (ids, references, pax, prices,
   schedules and slots, seat maps, language codes, input-field validation);
3. demo conventions (skipped with --rules-only): at least 20 products of every product type,
   exactly one SEATMAP product (an EVENT), taxonomy references within the product's city,
   netPrice < price <= originalPrice, fullName and email on every variant, flightNumber on airport
   transfers, oldId 1..n, url `/<city>/<slug>-<id>`, no repeated slot start per variant.

Exits 1 when there is any problem, else prints a one-line summary.
"""

import collections
import datetime
import json
import os
import re
import sys
import zoneinfo

PRODUCT_TYPES = ["TOUR", "ACTIVITY", "EVENT", "ATTRACTION", "TRANSFER", "AIRPORT_TRANSFER", "ADD_ON"]
LANGUAGES = {"EN", "ES", "FR", "IT", "DE", "PT", "NL", "PL", "KO", "JA", "ZH_HANS", "ZH_HANT", "AR", "DA",
             "RO", "RU", "SV", "TR"}
INVENTORY_TYPES = {"FIXED_START_FIXED_DURATION", "FIXED_START_FLEXIBLE_DURATION"}
SELECTION_TYPES = {"NORMAL", "SEATMAP"}
PROFILE_TYPES = {"PER_PERSON", "PER_GROUP"}
CASHBACK_TYPES = {"ABSOLUTE", "PERCENTAGE"}
MIN_PER_TYPE = 20

# ---------------------------------------------------------------------------------------------
# Shape. A spec is "str" "bool" "num" (any JSON number) "u32"/"u64"/"i64" (JSON integers),
# "[X]" a list of X, "{X}" an object with X values, "@name" an object of SCHEMA[name]; a trailing
# "?" allows null. A field is (spec, required).
# ---------------------------------------------------------------------------------------------

def zone_exists(name):
    """Whether `name` is an IANA time zone (the standard library's zoneinfo)."""
    try:
        zoneinfo.ZoneInfo(str(name))
        return True
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False


NAME_TR = {"name": ("str?", False)}
PRICE = {"price": ("num", True), "originalPrice": ("num", True), "netPrice": ("num", True)}
SCHEMA = {
    "catalog": {
        "baseCurrency": ("str", True), "currencies": ("[@currency]", True), "cities": ("[@city]", False),
        "categories": ("[@category]", False), "subcategories": ("[@subcategory]", False),
        "collections": ("[@collection]", False), "products": ("[@product]", False),
    },
    "currency": {"code": ("str", True), "currencyName": ("str", True), "symbol": ("str", True),
                 "localSymbol": ("str", True), "precision": ("u32", True), "rate": ("num", True)},
    "nameTr": NAME_TR,
    "city": {"code": ("str", True), "name": ("str", True), "timeZone": ("str", True), "imageUrl": ("str?", False),
             "translations": ("{@nameTr}", False)},
    "category": {"id": ("str", True), "name": ("str", True), "cityCode": ("str", True),
                 "translations": ("{@nameTr}", False)},
    "subcategory": {"id": ("str", True), "name": ("str", True), "categoryId": ("str", True),
                    "translations": ("{@nameTr}", False)},
    "collection": {"id": ("str", True), "name": ("str", True), "cityCode": ("str", True),
                   "translations": ("{@nameTr}", False)},
    "content": {k: ("str?", False) for k in [
        "highlights", "highlightsHtml", "shortSummary", "summaryHtml", "inclusions", "inclusionsHtml",
        "exclusions", "exclusionsHtml", "faqHtml", "ticketDeliveryInfoHtml"]},
    "productTr": {"name": ("str?", False), "content": ("@content", False)},
    "location": {"latitude": ("num", True), "longitude": ("num", True), "address": ("str?", False),
                 "city": ("str?", False), "postalCode": ("str?", False), "country": ("str?", False)},
    "media": {"url": ("str", True), "type": ("str", True)},
    "reviews": {"ratingsCount": ("u64", True), "averageRating": ("num", True)},
    "product": {
        "id": ("str", True), "name": ("str", True), "productType": ("str", True), "cityCode": ("str", True),
        "canonicalUrl": ("str", False), "url": ("str?", False), "neighbourhood": ("str?", False),
        "displayTags": ("[str]", False), "content": ("@content", False), "translations": ("{@productTr}", False),
        "media": ("[@media]", False), "startLocation": ("@location?", False), "endLocation": ("@location?", False),
        "reviewsSummary": ("@reviews", False), "hasInstantConfirmation": ("bool", False),
        "hasMobileTicket": ("bool", False), "primaryCategoryId": ("str", True),
        "secondaryCategoryIds": ("[str]", False), "primarySubCategoryId": ("str?", False),
        "subCategoryIds": ("[str]", False), "primaryCollectionId": ("str?", False),
        "collectionIds": ("[str]", False), "localeSpecificUrls": ("{str}", False),
        "inventorySelectionType": ("str", False), "variants": ("[@variant]", True),
    },
    "pax": {"min": ("u32", True), "max": ("u32", True)},
    "cashback": {"value": ("num", True), "type": ("str", True)},
    "validation": {"required": ("bool", False), "minLength": ("u32?", False), "maxLength": ("u32?", False),
                   "regex": ("str?", False), "minValue": ("num?", False), "maxValue": ("num?", False),
                   "values": ("[str]?", False)},
    "inputField": {"oldId": ("i64", True), "id": ("str", True), "name": ("str", True), "dataType": ("str", False),
                   "level": ("str", False), "validation": ("@validation", False)},
    "person": dict({"type": ("str", True), "name": ("str", True)}, **PRICE),
    "group": dict({"size": ("u32", True), "name": ("str", True)}, **PRICE),
    "cancellation": {"cancellable": ("bool", True), "cancellableUpToInMinutes": ("i64?", False)},
    "reschedule": {"reschedulable": ("bool", True), "reschedulableUpToInMinutes": ("i64?", False)},
    "schedule": {"startTimes": ("[str]", True), "daysAhead": ("u32", True), "capacity": ("u32", True),
                 "weekdays": ("[u32]?", False)},
    "slot": {"startDateTime": ("str", True), "capacity": ("u32", True)},
    "seatmap": {"sections": ("[@section]", True)},
    "section": {"name": ("str", True), "rows": ("[str]", True), "seatsPerRow": ("u32", True)},
    "variant": {
        "id": ("str", True), "name": ("str", True), "description": ("str", False), "duration": ("u32", False),
        "inventoryType": ("str", False), "pax": ("@pax", True), "cashback": ("@cashback?", False),
        "ticketDeliveryInfoHtml": ("str?", False), "tags": ("[str]", False),
        "inputFields": ("[@inputField]", False), "profileType": ("str", False), "persons": ("[@person]", False),
        "groups": ("[@group]", False), "cancellationPolicy": ("@cancellation", True),
        "reschedulePolicy": ("@reschedule", True), "schedule": ("@schedule?", False), "slots": ("[@slot]", False),
        "seatmap": ("@seatmap?", False),
    },
}
INT_LIMITS = {"u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1), "i64": (-2**63, 2**63 - 1)}


class Obj(dict):
    """A JSON object that remembers keys it saw more than once."""
    dups = ()


def pairs(items):
    obj = Obj()
    dups = []
    for k, v in items:
        if k in obj:
            dups.append(k)
        obj[k] = v
    obj.dups = dups
    return obj


def at(path, key):
    return f"{path}.{key}" if path else key


class Checker:
    def __init__(self, demo=True):
        self.problems = []
        self.demo = demo

    def p(self, path, message):
        self.problems.append((path or "(root)", message))

    # -- shape --------------------------------------------------------------------------------

    def shape(self, value, spec, path):
        if spec.endswith("?"):
            if value is None:
                return
            spec = spec[:-1]
        if value is None:
            self.p(path, "must not be null")
        elif spec.startswith("["):
            if not isinstance(value, list):
                self.p(path, "must be an array")
                return
            for i, item in enumerate(value):
                self.shape(item, spec[1:-1], f"{path}[{i}]")
        elif spec.startswith("{"):
            if not isinstance(value, dict):
                self.p(path, "must be an object")
                return
            for dup in getattr(value, "dups", ()):
                self.p(at(path, dup), "duplicate key")
            for k, item in value.items():
                self.shape(item, spec[1:-1], at(path, k))
        elif spec.startswith("@"):
            self.obj(value, SCHEMA[spec[1:]], path)
        elif spec == "str":
            if not isinstance(value, str):
                self.p(path, "must be a string")
        elif spec == "bool":
            if not isinstance(value, bool):
                self.p(path, "must be true or false")
        elif spec == "num":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.p(path, "must be a number")
        elif spec in INT_LIMITS:
            lo, hi = INT_LIMITS[spec]
            if isinstance(value, bool) or not isinstance(value, int):
                self.p(path, "must be an integer (no fraction, no quotes)")
            elif not lo <= value <= hi:
                self.p(path, f"must be an integer in {lo}..{hi}")
        else:
            raise ValueError(spec)

    def obj(self, value, fields, path):
        if not isinstance(value, dict):
            self.p(path, "must be an object")
            return
        for dup in getattr(value, "dups", ()):
            self.p(at(path, dup), "duplicate key")
        for k in value:
            if k not in fields:
                self.p(at(path, k), "unknown field (the importer refuses it)")
        for k, (spec, required) in fields.items():
            if k in value:
                self.shape(value[k], spec, at(path, k))
            elif required:
                self.p(at(path, k), "missing required field")

    # -- the documented rules ---------------------------------------------------------------------

    def unique(self, items, key, kind):
        seen = {}
        for i, item in enumerate(items):
            k = item.get(key) if isinstance(item, dict) else None
            if k is None:
                continue
            if k in seen:
                self.p(f"{kind}[{i}].{key}", f"duplicate {key} `{k}` (first at {kind}[{seen[k]}])")
            else:
                seen[k] = i
        return seen

    def languages(self, path, translations):
        for lang in translations or {}:
            if lang not in LANGUAGES:
                self.p(f"{path}.translations.{lang}", f"unknown language code `{lang}`")

    def rules(self, c):
        currencies = c.get("currencies") or []
        cities = c.get("cities") or []
        categories = c.get("categories") or []
        subcategories = c.get("subcategories") or []
        collections_ = c.get("collections") or []
        products = c.get("products") or []

        cur = self.unique(currencies, "code", "currencies")
        city_ix = self.unique(cities, "code", "cities")
        cat_ix = self.unique(categories, "id", "categories")
        sub_ix = self.unique(subcategories, "id", "subcategories")
        coll_ix = self.unique(collections_, "id", "collections")
        self.unique(products, "id", "products")

        base = c.get("baseCurrency")
        if base not in cur:
            self.p("baseCurrency", f"`{base}` is not in currencies")
        elif currencies[cur[base]].get("rate") != 1:
            self.p(f"currencies[{cur[base]}].rate", "the base currency's rate must be 1")
        for i, x in enumerate(currencies):
            rate = x.get("rate")
            if isinstance(rate, (int, float)) and not rate > 0:
                self.p(f"currencies[{i}].rate", "must be a positive number")

        for i, x in enumerate(cities):
            if not re.fullmatch(r"[A-Z_]+", str(x.get("code", ""))):
                self.p(f"cities[{i}].code", f"`{x.get('code')}` must be uppercase [A-Z_]+")
            if not zone_exists(x.get("timeZone")):
                self.p(f"cities[{i}].timeZone", f"`{x.get('timeZone')}` is not an IANA time zone")
            self.languages(f"cities[{i}]", x.get("translations"))
        for kind, items, ref, index in [("categories", categories, "cityCode", city_ix),
                                        ("subcategories", subcategories, "categoryId", cat_ix),
                                        ("collections", collections_, "cityCode", city_ix)]:
            for i, x in enumerate(items):
                if x.get(ref) not in index:
                    self.p(f"{kind}[{i}].{ref}", f"unknown {'city' if ref == 'cityCode' else 'category'} `{x.get(ref)}`")
                self.languages(f"{kind}[{i}]", x.get("translations"))

        variant_ix = {}
        for pi, product in enumerate(products):
            try:
                self.product_rules(f"products[{pi}]", product, city_ix, cat_ix, sub_ix, coll_ix,
                                   subcategories, variant_ix)
            except (AttributeError, TypeError, KeyError, ValueError):
                pass  # a shape problem, already reported
        return variant_ix

    def product_rules(self, path, product, city_ix, cat_ix, sub_ix, coll_ix, subcategories, variant_ix):
        pid = product.get("id", "")
        if not re.fullmatch(r"[0-9]{1,18}", str(pid)):
            self.p(at(path, "id"), f"`{pid}` must be digits (v1 serves it as an integer)")
        if product.get("productType") not in PRODUCT_TYPES:
            self.p(at(path, "productType"), f"`{product.get('productType')}` is not one of {' '.join(PRODUCT_TYPES)}")
        if product.get("cityCode") not in city_ix:
            self.p(at(path, "cityCode"), f"unknown city `{product.get('cityCode')}`")
        self.languages(path, product.get("translations"))
        primary = product.get("primaryCategoryId")
        if primary not in cat_ix:
            self.p(at(path, "primaryCategoryId"), f"unknown category `{primary}`")
        for k, cid in enumerate(product.get("secondaryCategoryIds") or []):
            if cid not in cat_ix:
                self.p(at(path, f"secondaryCategoryIds[{k}]"), f"unknown category `{cid}`")
        subs = product.get("subCategoryIds") or []
        for k, sid in enumerate(subs):
            if sid not in sub_ix:
                self.p(at(path, f"subCategoryIds[{k}]"), f"unknown subcategory `{sid}`")
        psub = product.get("primarySubCategoryId")
        if psub is not None:
            if psub not in subs:
                self.p(at(path, "primarySubCategoryId"), f"`{psub}` is not in subCategoryIds")
            elif psub in sub_ix and subcategories[sub_ix[psub]].get("categoryId") != primary:
                self.p(at(path, "primarySubCategoryId"), f"`{psub}` does not belong to the primary category `{primary}`")
        colls = product.get("collectionIds") or []
        for k, cid in enumerate(colls):
            if cid not in coll_ix:
                self.p(at(path, f"collectionIds[{k}]"), f"unknown collection `{cid}`")
        pcoll = product.get("primaryCollectionId")
        if pcoll is not None and pcoll not in colls:
            self.p(at(path, "primaryCollectionId"), f"`{pcoll}` is not in collectionIds")
        selection = product.get("inventorySelectionType", "NORMAL")
        if selection not in SELECTION_TYPES:
            self.p(at(path, "inventorySelectionType"), f"`{selection}` is not NORMAL or SEATMAP")
        variants = product.get("variants") or []
        if not variants:
            self.p(at(path, "variants"), "a product needs at least one variant")
        for vi, v in enumerate(variants):
            vpath = f"{path}.variants[{vi}]"
            try:
                self.variant_rules(vpath, v, selection == "SEATMAP", variant_ix)
            except (AttributeError, TypeError, KeyError, ValueError):
                pass

    def variant_rules(self, path, v, seatmap_product, variant_ix):
        vid = v.get("id")
        if vid in variant_ix:
            self.p(at(path, "id"), f"duplicate variant id `{vid}` (first at {variant_ix[vid]})")
        elif vid is not None:
            variant_ix[vid] = path
        pax = v.get("pax") or {}
        mn, mx = pax.get("min"), pax.get("max")
        if isinstance(mn, int) and isinstance(mx, int) and not 1 <= mn <= mx:
            self.p(at(path, "pax"), f"min ({mn}) must be ≥ 1 and ≤ max ({mx})")
        if v.get("inventoryType", "FIXED_START_FIXED_DURATION") not in INVENTORY_TYPES:
            self.p(at(path, "inventoryType"), f"`{v.get('inventoryType')}` is not one of {' '.join(sorted(INVENTORY_TYPES))}")
        cashback = v.get("cashback")
        if isinstance(cashback, dict) and cashback.get("type") not in CASHBACK_TYPES:
            self.p(at(path, "cashback.type"), f"`{cashback.get('type')}` is not ABSOLUTE or PERCENTAGE")
        profile = v.get("profileType", "PER_PERSON")
        persons, groups = v.get("persons") or [], v.get("groups") or []
        if profile == "PER_PERSON":
            if not any(x.get("type") == "ADULT" for x in persons):
                self.p(at(path, "persons"), "a PER_PERSON variant needs an ADULT price")
        elif profile == "PER_GROUP":
            if not groups:
                self.p(at(path, "groups"), "a PER_GROUP variant needs at least one group price")
        else:
            self.p(at(path, "profileType"), f"`{profile}` is not PER_PERSON or PER_GROUP")
        for kind, items in (("persons", persons), ("groups", groups)):
            for i, x in enumerate(items):
                ppath = f"{path}.{kind}[{i}]"
                price, original, net = x.get("price"), x.get("originalPrice"), x.get("netPrice")
                for name, val in (("price", price), ("originalPrice", original), ("netPrice", net)):
                    if isinstance(val, (int, float)) and val < 0:
                        self.p(at(ppath, name), f"must be ≥ 0 (is {val})")
                if isinstance(price, (int, float)) and isinstance(net, (int, float)) and net > price:
                    self.p(ppath, f"netPrice ({net}) is greater than price ({price})")
                if kind == "groups" and isinstance(x.get("size"), int) and x["size"] < 1:
                    self.p(at(ppath, "size"), "must be ≥ 1")

        schedule, slots = v.get("schedule"), v.get("slots") or []
        if schedule is None and not slots:
            self.p(path, "a variant needs a schedule or slots (or both)")
        if isinstance(schedule, dict):
            spath = at(path, "schedule")
            cap = schedule.get("capacity")
            if isinstance(cap, int) and cap < 1:
                self.p(at(spath, "capacity"), "must be ≥ 1")
            days = schedule.get("daysAhead")
            if isinstance(days, int) and not 1 <= days <= 366:
                self.p(at(spath, "daysAhead"), f"must be 1–366 (is {days})")
            for k, t in enumerate(schedule.get("startTimes") or []):
                if not (isinstance(t, str) and re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]", t)):
                    self.p(at(spath, f"startTimes[{k}]"), f"`{t}` is not HH:MM")
            for k, d in enumerate(schedule.get("weekdays") or []):
                if isinstance(d, int) and not 1 <= d <= 7:
                    self.p(at(spath, f"weekdays[{k}]"), f"ISO weekdays are 1–7 (is {d})")
        for k, s in enumerate(slots):
            start = s.get("startDateTime")
            if not valid_local(start):
                self.p(at(path, f"slots[{k}].startDateTime"), f"`{start}` is not YYYY-MM-DDTHH:MM:SS")
            cap = s.get("capacity")
            if isinstance(cap, int) and cap < 1:
                self.p(at(path, f"slots[{k}].capacity"), "must be ≥ 1")

        seatmap = v.get("seatmap")
        if seatmap_product and seatmap is None:
            self.p(at(path, "seatmap"), "variants of a SEATMAP product need a seatmap")
        if not seatmap_product and seatmap is not None:
            self.p(at(path, "seatmap"), "only SEATMAP products have a seatmap")
        if seatmap_product and isinstance(seatmap, dict):
            seats = sum(len(sec.get("rows") or []) * (sec.get("seatsPerRow") or 0)
                        for sec in seatmap.get("sections") or [])
            if seats < 1:
                self.p(at(path, "seatmap"), "the seat map has no seats")
            for k, s in enumerate(slots):
                if s.get("capacity") != seats:
                    self.p(at(path, f"slots[{k}].capacity"),
                           f"is {s.get('capacity')} but the seat map has {seats} seats")
            if isinstance(schedule, dict) and schedule.get("capacity") != seats:
                self.p(at(path, "schedule.capacity"),
                       f"is {schedule.get('capacity')} but the seat map has {seats} seats")

        for k, f in enumerate(v.get("inputFields") or []):
            fpath = at(path, f"inputFields[{k}].validation")
            val = f.get("validation") or {}
            regex = val.get("regex")
            if isinstance(regex, str):
                try:
                    re.compile(regex)
                except re.error as e:
                    self.p(at(fpath, "regex"), f"does not compile: {e}")
                else:
                    if re.search(r"\(\?<?[=!]|\(\?>|\(\?P=|\\[1-9]", regex):
                        self.p(at(fpath, "regex"),
                               "uses look-around, atomic groups or back-references, which the importer's "
                               "regex engine (Rust `regex`) does not support")
            for lo, hi in (("minLength", "maxLength"), ("minValue", "maxValue")):
                a, b = val.get(lo), val.get(hi)
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > b:
                    self.p(fpath, f"{lo} ({a}) is greater than {hi} ({b})")

    # -- demo conventions -----------------------------------------------------------------------

    def conventions(self, c):
        cities = {x.get("code"): x for x in c.get("cities") or []}
        cat_city = {x.get("id"): x.get("cityCode") for x in c.get("categories") or []}
        sub_cat = {x.get("id"): x.get("categoryId") for x in c.get("subcategories") or []}
        coll_city = {x.get("id"): x.get("cityCode") for x in c.get("collections") or []}
        products = c.get("products") or []
        per_type = collections.Counter(p.get("productType") for p in products)
        for t in PRODUCT_TYPES:
            if per_type[t] < MIN_PER_TYPE:
                self.p("products", f"{per_type[t]} {t} product(s), the demo needs at least {MIN_PER_TYPE}")
        seatmaps = [i for i, p in enumerate(products) if p.get("inventorySelectionType") == "SEATMAP"]
        if len(seatmaps) != 1:
            self.p("products", f"{len(seatmaps)} SEATMAP products, the demo has exactly one")
        for i in seatmaps:
            if products[i].get("productType") != "EVENT":
                self.p(f"products[{i}].productType", "the SEATMAP product is an EVENT")
        for pi, product in enumerate(products):
            try:
                self.product_conventions(f"products[{pi}]", product, cities, cat_city, sub_cat, coll_city)
            except (AttributeError, TypeError, KeyError, ValueError):
                pass

    def product_conventions(self, path, product, cities, cat_city, sub_cat, coll_city):
        city = product.get("cityCode")
        primary = product.get("primaryCategoryId")
        secondary = product.get("secondaryCategoryIds") or []
        for name, ids in (("primaryCategoryId", [primary]), ("secondaryCategoryIds", secondary)):
            for cid in ids:
                if cid in cat_city and cat_city[cid] != city:
                    self.p(at(path, name), f"category `{cid}` is in {cat_city[cid]}, the product in {city}")
        if primary in secondary:
            self.p(at(path, "secondaryCategoryIds"), f"repeats the primary category `{primary}`")
        for k, sid in enumerate(product.get("subCategoryIds") or []):
            if sid in sub_cat and sub_cat[sid] not in [primary] + secondary:
                self.p(at(path, f"subCategoryIds[{k}]"),
                       f"`{sid}` belongs to category `{sub_cat[sid]}`, not to one of the product's")
        if (product.get("subCategoryIds") or [None])[0] != product.get("primarySubCategoryId"):
            self.p(at(path, "subCategoryIds"), "the primary subcategory comes first")
        for k, cid in enumerate(product.get("collectionIds") or []):
            if cid in coll_city and coll_city[cid] != city:
                self.p(at(path, f"collectionIds[{k}]"), f"collection `{cid}` is in {coll_city[cid]}")
        city_slug = str(city).lower().replace("_", "-")
        url = product.get("url")
        if not (isinstance(url, str) and re.fullmatch(rf"/{re.escape(city_slug)}/[a-z0-9]+(-[a-z0-9]+)*-{product.get('id')}", url)):
            self.p(at(path, "url"), f"`{url}` is not /{city_slug}/<slug>-{product.get('id')}")
        for lang in product.get("localeSpecificUrls") or {}:
            if lang not in LANGUAGES:
                self.p(at(path, f"localeSpecificUrls.{lang}"), f"unknown language code `{lang}`")
        for k, m in enumerate(product.get("media") or []):
            if m.get("type") != "IMAGE":
                self.p(at(path, f"media[{k}].type"), "the demo's media are IMAGEs")
        for vi, v in enumerate(product.get("variants") or []):
            vpath = f"{path}.variants[{vi}]"
            if not re.fullmatch(r"[0-9]+", str(v.get("id"))):
                self.p(at(vpath, "id"), "the demo's variant ids are digits")
            for kind in ("persons", "groups"):
                for i, x in enumerate(v.get(kind) or []):
                    price, original, net = x.get("price"), x.get("originalPrice"), x.get("netPrice")
                    if not net < price <= original:
                        self.p(f"{vpath}.{kind}[{i}]",
                               f"the demo keeps netPrice < price ≤ originalPrice ({net}, {price}, {original})")
                    for name, val in (("price", price), ("originalPrice", original), ("netPrice", net)):
                        if round(val, 2) != val:
                            self.p(f"{vpath}.{kind}[{i}].{name}", f"{val} has more than 2 decimals")
            fields = v.get("inputFields") or []
            ids = [f.get("id") for f in fields]
            needed = ["fullName", "email"] + (["flightNumber"] if product.get("productType") == "AIRPORT_TRANSFER" else [])
            for fid in needed:
                if fid not in ids:
                    self.p(at(vpath, "inputFields"), f"no `{fid}` field")
            if len(set(ids)) != len(ids):
                self.p(at(vpath, "inputFields"), "repeats a field id")
            if [f.get("oldId") for f in fields] != list(range(1, len(fields) + 1)):
                self.p(at(vpath, "inputFields"), "oldId is not 1..n in order")
            starts = [s.get("startDateTime") for s in v.get("slots") or []]
            if len(set(starts)) != len(starts):
                self.p(at(vpath, "slots"), "the same startDateTime twice")


def valid_local(text):
    if not (isinstance(text, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}", text)):
        return False
    try:
        datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return False
    return True


def main(argv):
    demo = True
    args = []
    for a in argv[1:]:
        if a == "--rules-only":
            demo = False
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        else:
            args.append(a)
    path = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.json")
    try:
        with open(path, encoding="utf-8") as f:
            catalog = json.load(f, object_pairs_hook=pairs)
    except (OSError, ValueError) as e:
        print(f"{path}: cannot read the catalog: {e}")
        return 1
    checker = Checker(demo)
    checker.obj(catalog, SCHEMA["catalog"], "")
    if isinstance(catalog, dict):
        try:
            checker.rules(catalog)
        except (AttributeError, TypeError, KeyError, ValueError):
            pass
        if demo:
            try:
                checker.conventions(catalog)
            except (AttributeError, TypeError, KeyError, ValueError):
                pass
    if checker.problems:
        for p, message in checker.problems:
            print(f"{p}: {message}")
        print(f"{path}: {len(checker.problems)} problem(s)")
        return 1
    products = catalog.get("products") or []
    per_type = collections.Counter(p["productType"] for p in products)
    variants = sum(len(p["variants"]) for p in products)
    seatmaps = sum(1 for p in products if p.get("inventorySelectionType") == "SEATMAP")
    translated = sum(1 for p in products if p.get("translations"))
    print(f"OK {os.path.basename(path)}: {len(products)} products ("
          + ", ".join(f"{t} {per_type[t]}" for t in PRODUCT_TYPES)
          + f"), {len(catalog.get('cities') or [])} cities ({' '.join(c['code'] for c in catalog.get('cities') or [])}), "
          f"{variants} variants, {len(catalog.get('categories') or [])} categories, "
          f"{len(catalog.get('subcategories') or [])} subcategories, {len(catalog.get('collections') or [])} collections, "
          f"{seatmaps} SEATMAP, {translated} translated, {len(catalog.get('currencies') or [])} currencies")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The JSON extraction suite: prompts with a schema and one valid example each (`specrt bench --suite json`).

Each case: a passage to extract from, the schema the answer must follow, and an `example` instance that is
valid (the tests check it against the schema with `jsonschema`, and that the constraint accepts its tokens).
Sources: cases marked `origin="json-schema.org"` restate the example schemas published on json-schema.org
("Getting started" product, "Miscellaneous examples": address, geographical location, card/person, blog post,
device, e-commerce order, job posting, movie, user profile); the others were written for specrt. Schemas
bound their strings and arrays (maxLength / maxItems) where a small model could otherwise run on.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class JsonCase:
    name: str
    passage: str
    schema: dict[str, Any]
    example: Any
    origin: str = "specrt"

    @property
    def prompt(self) -> str:
        return ("Extract the information from the text below as JSON.\n\n"
                f"Text: {self.passage}\n\nJSON: ")


def _s(n: int = 40, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "maxLength": n, **kw}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


CASES: tuple[JsonCase, ...] = (
    JsonCase("person", "Maria Lopez is a 34 year old engineer living in Madrid.",
             _obj({"name": _s(), "age": {"type": "integer", "minimum": 0, "maximum": 150}, "city": _s()}),
             {"name": "Maria Lopez", "age": 34, "city": "Madrid"}),
    JsonCase("sentiment", "The battery life is terrible and the screen cracked after two days.",
             _obj({"sentiment": {"enum": ["positive", "negative", "neutral"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
             {"sentiment": "negative", "confidence": 0.9}),
    JsonCase("invoice", "Invoice INV-2024-0042 from Acme Corp, total 1,250.50 EUR, due on 2024-07-15.",
             _obj({"invoice_id": {"type": "string", "pattern": "^INV-[0-9]{4}-[0-9]{4}$"}, "vendor": _s(),
                   "total": {"type": "number"}, "currency": {"enum": ["EUR", "USD", "GBP"]},
                   "due_date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}),
             {"invoice_id": "INV-2024-0042", "vendor": "Acme Corp", "total": 1250.5, "currency": "EUR",
              "due_date": "2024-07-15"}),
    JsonCase("meeting", "Team sync on Friday at 10:30 with Alice, Bob and Chen in room B2.",
             _obj({"day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]},
                   "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                   "attendees": {"type": "array", "items": _s(20), "minItems": 1, "maxItems": 6},
                   "room": _s(10)}),
             {"day": "Friday", "time": "10:30", "attendees": ["Alice", "Bob", "Chen"], "room": "B2"}),
    JsonCase("recipe", "Pancakes: mix 2 eggs, 200 g flour and 300 ml milk; fry for 3 minutes per side.",
             _obj({"dish": _s(), "ingredients": {"type": "array", "maxItems": 6, "items": _obj(
                 {"item": _s(20), "quantity": {"type": "number"}, "unit": {"enum": ["g", "ml", "piece"]}})},
                   "minutes": {"type": "integer", "minimum": 0, "maximum": 600}}),
             {"dish": "Pancakes", "ingredients": [{"item": "eggs", "quantity": 2, "unit": "piece"},
                                                  {"item": "flour", "quantity": 200, "unit": "g"}], "minutes": 6}),
    JsonCase("flight", "Flight LH 454 leaves Frankfurt (FRA) for San Francisco (SFO), seat 32C, economy.",
             _obj({"flight": {"type": "string", "pattern": "^[A-Z]{2} ?[0-9]{1,4}$"},
                   "from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "seat": {"type": "string", "pattern": "^[0-9]{1,2}[A-K]$"},
                   "cabin": {"enum": ["economy", "premium", "business", "first"]}}),
             {"flight": "LH 454", "from": "FRA", "to": "SFO", "seat": "32C", "cabin": "economy"}),
    JsonCase("contact", "Reach John Smith at john.smith@example.com or +1 555 0100.",
             _obj({"name": _s(), "email": {"type": "string", "pattern": "^[a-z.]+@[a-z]+\\.[a-z]{2,4}$"},
                   "phone": _s(20)}),
             {"name": "John Smith", "email": "john.smith@example.com", "phone": "+1 555 0100"}),
    JsonCase("order", "Order 7781: 3 notebooks at 2.50 each and 1 pen at 1.20, paid by card.",
             _obj({"order_id": {"type": "integer"}, "items": {"type": "array", "maxItems": 5, "items": _obj(
                 {"product": _s(20), "count": {"type": "integer", "minimum": 1}, "unit_price": {"type": "number"}})},
                   "payment": {"enum": ["card", "cash", "transfer"]}}),
             {"order_id": 7781, "items": [{"product": "notebook", "count": 3, "unit_price": 2.5}], "payment": "card"}),
    JsonCase("weather", "Tomorrow in Oslo: light snow, high of -2 C, low of -9 C, wind 15 km/h.",
             _obj({"city": _s(), "condition": {"enum": ["sunny", "cloudy", "rain", "snow", "storm"]},
                   "high_c": {"type": "integer"}, "low_c": {"type": "integer"}, "wind_kmh": {"type": "number"}}),
             {"city": "Oslo", "condition": "snow", "high_c": -2, "low_c": -9, "wind_kmh": 15}),
    JsonCase("book", "'The Left Hand of Darkness' by Ursula K. Le Guin, published 1969, 304 pages, science fiction.",
             _obj({"title": _s(60), "author": _s(), "year": {"type": "integer", "minimum": 1400, "maximum": 2100},
                   "pages": {"type": "integer"}, "genres": {"type": "array", "items": _s(20), "maxItems": 3}}),
             {"title": "The Left Hand of Darkness", "author": "Ursula K. Le Guin", "year": 1969, "pages": 304,
              "genres": ["science fiction"]}),
    JsonCase("company", "Globex, founded in 1989 in Springfield, employs 5,200 people; CEO Hank Scorpio.",
             _obj({"company": _s(), "founded": {"type": "integer"}, "headquarters": _obj({"city": _s()}),
                   "employees": {"type": "integer"}, "ceo": _obj({"name": _s()})}),
             {"company": "Globex", "founded": 1989, "headquarters": {"city": "Springfield"}, "employees": 5200,
              "ceo": {"name": "Hank Scorpio"}}),
    JsonCase("bug_report", "Crash when saving a file larger than 2 GB on Windows 11; severity high; version 3.4.1.",
             _obj({"summary": _s(80), "os": {"enum": ["Windows", "macOS", "Linux", "Android", "iOS"]},
                   "severity": {"enum": ["low", "medium", "high", "critical"]},
                   "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"}}),
             {"summary": "Crash when saving a file larger than 2 GB", "os": "Windows", "severity": "high",
              "version": "3.4.1"}),
    JsonCase("boolean_flags", "The apartment has a balcony, no elevator, and pets are allowed.",
             _obj({"balcony": {"type": "boolean"}, "elevator": {"type": "boolean"}, "pets_allowed": {"type": "boolean"}}),
             {"balcony": True, "elevator": False, "pets_allowed": True}),
    # --- restated from the examples on json-schema.org ---
    JsonCase("product", "Product 17, a green ceramic mug, costs 12.99; tags: kitchen, gift; 10 x 8 x 9.5 cm.",
             {"type": "object", "properties": {
                 "productId": {"type": "integer"}, "productName": {"type": "string"},
                 "price": {"type": "number", "exclusiveMinimum": 0},
                 "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                 "dimensions": {"type": "object", "properties": {"length": {"type": "number"},
                                                                 "width": {"type": "number"},
                                                                 "height": {"type": "number"}},
                                "required": ["length", "width", "height"]}},
              "required": ["productId", "productName", "price"]},
             {"productId": 17, "productName": "green ceramic mug", "price": 12.99, "tags": ["kitchen", "gift"],
              "dimensions": {"length": 10, "width": 8, "height": 9.5}}, "json-schema.org"),
    JsonCase("address", "Send it to 12 Rue de Rivoli, 75004 Paris, Ile-de-France, France.",
             {"type": "object", "properties": {
                 "post-office-box": {"type": "string"}, "extended-address": {"type": "string"},
                 "street-address": {"type": "string"}, "locality": {"type": "string"}, "region": {"type": "string"},
                 "postal-code": {"type": "string"}, "country-name": {"type": "string"}},
              "required": ["locality", "region", "country-name"]},
             {"street-address": "12 Rue de Rivoli", "locality": "Paris", "region": "Ile-de-France",
              "postal-code": "75004", "country-name": "France"}, "json-schema.org"),
    JsonCase("geo_location", "The summit of Mont Blanc is at latitude 45.8326 and longitude 6.8652.",
             {"type": "object", "required": ["latitude", "longitude"], "properties": {
                 "latitude": {"type": "number", "minimum": -90, "maximum": 90},
                 "longitude": {"type": "number", "minimum": -180, "maximum": 180}}},
             {"latitude": 45.8326, "longitude": 6.8652}, "json-schema.org"),
    JsonCase("blog_post", "Post 'Why we moved to Rust' by Dana Kim, published 2023-05-02, tags: rust, backend.",
             {"type": "object", "properties": {
                 "title": {"type": "string"}, "content": {"type": "string"},
                 "publishedDate": {"type": "string", "format": "date"},
                 "author": {"type": "object", "properties": {"username": {"type": "string"},
                                                             "email": {"type": "string"}},
                            "required": ["username"]},
                 "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["title", "author"]},
             {"title": "Why we moved to Rust", "publishedDate": "2023-05-02", "author": {"username": "Dana Kim"},
              "tags": ["rust", "backend"]}, "json-schema.org"),
    JsonCase("device", "The device is a smartphone with a 6.1 inch screen and a 3200 mAh battery.",
             {"type": "object", "properties": {
                 "deviceType": {"type": "string"},
                 "screenSize": {"type": "number", "minimum": 0}, "batteryCapacityMah": {"type": "integer"}},
              "required": ["deviceType"]},
             {"deviceType": "smartphone", "screenSize": 6.1, "batteryCapacityMah": 3200}, "json-schema.org"),
    JsonCase("ecommerce_order", "Order A-19 contains item 5 (USB cable, 7.5) and item 9 (charger, 19.0).",
             {"type": "object", "properties": {
                 "orderId": {"type": "string"},
                 "items": {"type": "array", "items": {"type": "object", "properties": {
                     "itemId": {"type": "string"}, "name": {"type": "string"}, "price": {"type": "number", "minimum": 0}},
                     "required": ["itemId", "price"]}}},
              "required": ["orderId", "items"]},
             {"orderId": "A-19", "items": [{"itemId": "5", "name": "USB cable", "price": 7.5},
                                           {"itemId": "9", "name": "charger", "price": 19.0}]}, "json-schema.org"),
    JsonCase("job_posting", "Hiring: senior data engineer at Initech, remote, salary 95000, posted 2024-02-01.",
             {"type": "object", "properties": {
                 "title": {"type": "string"}, "company": {"type": "string"}, "location": {"type": "string"},
                 "salary": {"type": "number", "minimum": 0}, "postedDate": {"type": "string", "format": "date"}},
              "required": ["title", "company"]},
             {"title": "senior data engineer", "company": "Initech", "location": "remote", "salary": 95000,
              "postedDate": "2024-02-01"}, "json-schema.org"),
    JsonCase("movie", "Alien (1979), directed by Ridley Scott, a horror film starring Sigourney Weaver, rated 8.5.",
             {"type": "object", "properties": {
                 "title": {"type": "string"}, "director": {"type": "string"},
                 "releaseDate": {"type": "integer"},
                 "genre": {"type": "string", "enum": ["Action", "Comedy", "Drama", "Science Fiction", "Horror"]},
                 "cast": {"type": "array", "items": {"type": "string"}},
                 "rating": {"type": "number", "minimum": 0, "maximum": 10}},
              "required": ["title", "director", "genre"]},
             {"title": "Alien", "director": "Ridley Scott", "releaseDate": 1979, "genre": "Horror",
              "cast": ["Sigourney Weaver"], "rating": 8.5}, "json-schema.org"),
    JsonCase("user_profile", "User jdoe (Jane Doe, 29, jane@example.org) likes hiking and chess.",
             {"type": "object", "properties": {
                 "username": {"type": "string"}, "email": {"type": "string"}, "fullName": {"type": "string"},
                 "age": {"type": "integer", "minimum": 0},
                 "interests": {"type": "array", "items": {"type": "string"}}},
              "required": ["username", "email"]},
             {"username": "jdoe", "email": "jane@example.org", "fullName": "Jane Doe", "age": 29,
              "interests": ["hiking", "chess"]}, "json-schema.org"),
    JsonCase("card", "Dr. Alan Turing, mathematician at the University of Manchester, alan@turing.example.",
             {"type": "object", "required": ["familyName", "givenName"], "properties": {
                 "fn": {"type": "string"}, "familyName": {"type": "string"}, "givenName": {"type": "string"},
                 "honorificPrefix": {"type": "array", "items": {"type": "string"}},
                 "email": {"type": "object", "properties": {"type": {"type": "string"}, "value": {"type": "string"}}},
                 "org": {"type": "object", "properties": {"organizationName": {"type": "string"},
                                                          "organizationUnit": {"type": "string"}}}}},
             {"familyName": "Turing", "givenName": "Alan", "honorificPrefix": ["Dr."],
              "org": {"organizationName": "University of Manchester"}}, "json-schema.org"),
)

/* The events page (being built). */
"use strict";
